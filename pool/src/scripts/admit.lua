-- Admits a new job and enqueues its start at the owner, atomically (I3).
-- KEYS: base, 9 owner inbox stream, 10 cleanup hash,
--       11 idempotency marker of the key (string, PX = window),
--       12 schedule job set (hash), 13 schedule leader-lease lock (hash)
-- ARGV: base, 4 job key, 5 body (msgpack job body), 6 owner worker id,
--       7 reply request id, 8 reply node id, 9 max queued (0: no limit),
--       10 pending ttl ms, 11 inbox maxlen (0: none),
--       12 idempotency window ms (0: none),
--       13 schedule leader token (0: not a schedule's dispatch),
--       14 worker ttl ms (the recovery window after a data loss)
-- Returns {'ok', token} | {'exists'} | {'recovering'} | {'recent', ms left}
--       | {'not_leader'} | {'no_worker'} | {'full', len}.
-- The pending guard is "<token> <deadline_ms> <node>/<request>", which makes
-- a retry of the same admission (lost reply) answer 'ok' again.
-- The marker is "<admitted_ms> <token>"; with a window, a key admitted less
-- than a window ago is refused even if it has finished since. A schedule's
-- dispatch is admitted only while the lease record still carries the
-- leader's token, and is recorded in the schedule's job set.
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
if recovering(tonumber(ARGV[14])) then
  return {'recovering'}
end
local now = now_ms()
local window = tonumber(ARGV[12])
if window > 0 then
  local marker = redis.call('GET', KEYS[11])
  local at = marker and tonumber(string.match(marker, '^(%d+)'))
  if at and now - at < window then
    return {'recent', window - (now - at)}
  end
end
local leader = ARGV[13]
if leader ~= '0' and redis.call('HGET', KEYS[13], 'token') ~= leader then
  return {'not_leader'}
end
if redis.call('HEXISTS', WORKERS[1], owner) == 0 or redis.call('HEXISTS', KEYS[10], owner) == 1 then
  return {'no_worker'}
end
local max = tonumber(ARGV[9])
if max > 0 then
  local len = redis.call('XLEN', inbox)
  if len >= max then return {'full', len} end
end
local token = next_token(key)
mset(PENDING, key, string.format('%d %d', token, now + tonumber(ARGV[10])) .. mine)
redis.call('HSET', PAYLOADS, key, string.format('%d ', now) .. body)
if window > 0 then
  redis.call('SET', KEYS[11], string.format('%d %d', now, token), 'PX', window)
end
if leader ~= '0' then
  redis.call('HSET', KEYS[12], key, string.format('%d', token))
end
stream_add(inbox, 'start', start_header(token, now, 0, tonumber(ARGV[7]), ARGV[8]) .. body, tonumber(ARGV[11]))
return {'ok', token}
