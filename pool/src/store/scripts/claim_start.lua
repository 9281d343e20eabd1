-- Claims a job for a worker *before* its handler starts it, so that no two
-- workers ever run one key (I1): a start is only attempted by the worker
-- whose claim Redis accepted. Ownership is recorded with the entry's
-- fencing token and the pending guard cleared. The inbox entry stays until
-- the start is confirmed (started.lua) or refused (start_failed.lua), so a
-- claim whose reply was lost is simply claimed again.
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply),
--       11 cleanup hash, 12 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none), 9 worker ttl ms (the recovery
--       window), 10 the revisions the node has seen (`went_back`)
-- Returns 'ok' | 'superseded' (entry removed, dispatcher answered) |
-- 'unregistered' (the worker is gone or being cleaned up: the entry stays
-- for the cleaner to move) | 'gone' (the entry is no longer in this
-- worker's inbox: a cleaner moved it, and the copy it appended elsewhere,
-- which may already be starting there, is the live one) | 'recovering'
-- (Redis lost data or went back in time and the pool recovers: the entry
-- stays, to be claimed once every running copy has re-asserted).
local key, token, worker = ARGV[4], ARGV[5], ARGV[6]
if redis.call('HEXISTS', WORKERS[1], worker) == 0 or redis.call('HEXISTS', KEYS[11], worker) == 1 then
  return 'unregistered'
end
if #redis.call('XRANGE', KEYS[9], ARGV[7], ARGV[7]) == 0 then
  return 'gone'
end
local mine = worker .. ' ' .. token
local running = mget(JOBS, key)
if running == mine then
  -- Claimed already: a retry after a lost reply.
  return 'ok'
end
local p = mget(PENDING, key)
if running or (not p) or string.sub(p, 1, #token + 1) ~= token .. ' ' then
  stream_remove(KEYS[9], ARGV[7])
  if ARGV[8] ~= '0' then
    stream_add(KEYS[10], 'reply', ARGV[8] .. ' superseded', 1000)
  end
  return 'superseded'
end
-- While the pool recovers, the entry may be one Redis brought back by
-- going back in time, of a key that runs on another worker with a newer
-- token Redis lost and that worker has not re-asserted yet: a claim now
-- would run the key twice (chaos soak seed 1432: a hand-off's start entry,
-- back with the rollback, claimed by its new owner, cut off until then,
-- while the worker it had gone back to ran it). Nothing is admitted then
-- either; a retry of a claim that went through is answered above.
local ttl = tonumber(ARGV[9])
if went_back(ARGV[10], ttl, KEYS[12]) or recovering(ttl) then
  return 'recovering'
end
mdel(PENDING, key)
mset(JOBS, key, mine)
return 'ok'
