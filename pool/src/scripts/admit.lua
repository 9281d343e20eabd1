-- Admits a new job and enqueues its start at the owner, atomically (I3).
-- KEYS: base, 9 owner inbox stream, 10 cleanup hash
-- ARGV: base, 4 job key, 5 body (msgpack job body), 6 owner worker id,
--       7 reply request id, 8 reply node id, 9 max queued (0: no limit),
--       10 pending ttl ms, 11 inbox maxlen (0: none)
-- Returns {'ok', token} | {'exists'} | {'no_worker'} | {'full', len}.
-- The pending guard is "<token> <deadline_ms> <node>/<request>", which makes
-- a retry of the same admission (lost reply) answer 'ok' again.
local key, body, owner = ARGV[4], ARGV[5], ARGV[6]
local inbox = KEYS[9]
local mine = ' ' .. ARGV[8] .. '/' .. ARGV[7]
local guard = mget(PENDING, key)
if guard and string.sub(guard, -#mine) == mine then
  -- A retry of this very admission after a lost reply.
  return {'ok', tonumber(string.match(guard, '^(%d+) '))}
end
if guard or redis.call('HEXISTS', JOBS[1], key) == 1 then
  return {'exists'}
end
if redis.call('HEXISTS', WORKERS[1], owner) == 0 or redis.call('HEXISTS', KEYS[10], owner) == 1 then
  return {'no_worker'}
end
local max = tonumber(ARGV[9])
if max > 0 then
  local len = redis.call('XLEN', inbox)
  if len >= max then return {'full', len} end
end
local now = now_ms()
local token = redis.call('HINCRBY', FENCING, key, 1)
mset(PENDING, key, string.format('%d %d', token, now + tonumber(ARGV[10])) .. mine)
redis.call('HSET', PAYLOADS, key, string.format('%d ', now) .. body)
stream_add(inbox, 'start', start_header(token, now, 0, tonumber(ARGV[7]), ARGV[8]) .. body, tonumber(ARGV[11]))
return {'ok', token}
