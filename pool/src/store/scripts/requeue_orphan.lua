-- Requeues an orphan the sweep reported due (`sweep_orphans.lua`), after
-- checking again, atomically, that it still is one in the same state and
-- that its mark is past the grace period: no pending dispatch, the same
-- record (or none), its owner not registered, the same fencing token.
-- Then as a hand-off: the record dropped, a new fencing token, the pending
-- guard set and the start enqueued at the target; the mark removed.
-- KEYS: base, 9 target inbox, 10 cleanup hash, 11 orphan marks hash,
--       12 keepalive hash
-- ARGV: base, 4 job key, 5 record the sweep saw ('-': none), 6 target
--       worker, 7 pending ttl ms, 8 inbox maxlen, 9 worker ttl ms (the
--       recovery window after a data loss), 10 grace ms, 11 the least
--       server time (ms) it can be now by the caller's clock (the grace is
--       judged by the smaller of that and `TIME`, see `sweep_orphans.lua`;
--       so is the target's silence, see `worker_current`)
-- A dispatch marked over (a stop or end made to stand again after a rollback, see
-- `dispatch_over`) is ended instead: {'ended'}.
-- Returns {'ok', token} | {'ended'} | {'changed'} (not the orphan the sweep saw, or not
--       due: nothing done) | {'recovering'} | {'no_target'} | {'no_payload'}
local key, state, target = ARGV[4], ARGV[5], ARGV[6]
local MARKS = KEYS[11]
if redis.call('HEXISTS', PENDING[1], key) == 1 then return {'changed'} end
local record = mget(JOBS, key)
if (record or '-') ~= state then return {'changed'} end
if record then
  local owner = string.match(record, '^(%S+) %d+$')
  if (not owner) or redis.call('HEXISTS', WORKERS[1], owner) == 1 then
    return {'changed'}
  end
end
local mark = redis.call('HGET', MARKS, key)
local since, what = nil, nil
if mark then since, what = string.match(mark, '^(%d+) (.*)$') end
if what ~= state .. ' ' .. (redis.call('HGET', FENCING, key) or '0')
    or math.min(now_ms(), tonumber(ARGV[11]) or now_ms()) - tonumber(since)
      < tonumber(ARGV[10]) then
  return {'changed'}
end
if recovering(tonumber(ARGV[9])) then return {'recovering'} end
if not worker_current(target, KEYS[10], KEYS[12], tonumber(ARGV[9]), tonumber(ARGV[11])) then
  return {'no_target'}
end
if redis.call('HEXISTS', PAYLOADS, key) == 0 then
  redis.call('HDEL', MARKS, key)
  return {'no_payload'}
end
if record then mdel(JOBS, key) end
redis.call('HDEL', MARKS, key)
local token, ended = enqueue_stored(key, KEYS[9], tonumber(ARGV[7]), tonumber(ARGV[8]), true)
if not token then return {ended or 'no_payload'} end
return {'ok', token}
