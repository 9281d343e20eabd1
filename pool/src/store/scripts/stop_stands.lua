-- After Redis went back in time, a worker makes a stop it carried out stand
-- again: Redis may have lost it, and the older state it went back to may
-- show the stopped run (or an older one) as running, pending or orphaned —
-- which the cleanup of a dead worker or the orphan sweep would start again.
-- Whatever Redis shows for `key` at or below the stopped run's token goes
-- (record, pending guard, and the payload when it is that old), and the
-- fencing counter is raised above the token, so no copy of those runs can
-- re-assert. A newer record or guard (a dispatch after the stop) is left,
-- and so is the payload while the counter is above the token: a newer run
-- was issued (a hand-off given back, a suspended run left to the orphan
-- sweep: both raise the counter to their token), and the payload, of the
-- same admission as the stopped run, is that run's only copy.
-- KEYS: base
-- ARGV: base, then two per stop: job key, fencing token of the stopped run
-- (a recovery makes many stops stand in a few calls: until they stand, a
-- crash of the node that remembers them takes them along)
-- Returns one status per stop: 'removed' | 'newer' | 'none'
local function stand(key, stopped)
  local j = mget(JOBS, key)
  local p = mget(PENDING, key)
  local recorded = j and tonumber(string.match(j, ' (%d+)$') or '') or 0
  local guarded = p and tonumber(string.match(p, '^(%d+)') or '') or 0
  if recorded > stopped or guarded > stopped then return 'newer' end
  local removed = false
  if j then mdel(JOBS, key); removed = true end
  if p then mdel(PENDING, key); removed = true end
  local current = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
  local stored = current <= stopped and redis.call('HGET', PAYLOADS, key)
  if stored then
    -- "<created_ms> <body>": a payload admitted after the stop (its record
    -- or guard lost, or not re-asserted yet) is newer than the stopped
    -- run's token, which was issued at or after that run's own admission.
    local created = payload_created_ms(stored)
    if removed or created * 1000 <= stopped then
      redis.call('HDEL', PAYLOADS, key)
      removed = true
    end
  end
  if current <= stopped then
    redis.call('HSET', FENCING, key, string.format('%d', stopped + 1))
  end
  if removed then return 'removed' end
  return 'none'
end

local statuses = {}
for i = 4, #ARGV - 1, 2 do
  statuses[#statuses + 1] = stand(ARGV[i], tonumber(ARGV[i + 1]) or 0)
end
return statuses
