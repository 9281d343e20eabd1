-- Records that a worker started a job: ownership with its fencing token,
-- pending guard cleared, inbox entry removed, dispatcher answered.
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none)
-- Returns 'ok' | 'superseded' | 'unregistered'. Idempotent: a retry after a
-- lost reply finds its own record and answers 'ok' again.
local key, token, worker, id = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local request = ARGV[8]
if redis.call('HEXISTS', WORKERS[1], worker) == 0 then
  -- Being cleaned up: leave the entry for the cleaner to move.
  return 'unregistered'
end
local p = mget(PENDING, key)
local status = 'ok'
if mget(JOBS, key) == worker .. ' ' .. token then
  -- Already recorded: this is a retry after a lost reply.
  status = 'ok'
elseif (not p) or string.sub(p, 1, #token + 1) ~= token .. ' ' or redis.call('HEXISTS', JOBS[1], key) == 1 then
  status = 'superseded'
else
  mdel(PENDING, key)
  mset(JOBS, key, worker .. ' ' .. token)
end
stream_remove(KEYS[9], id)
if request ~= '0' then
  stream_add(KEYS[10], 'reply', request .. ' ' .. status, 1000)
end
return status
