-- Acquire a lock if nobody holds it (flotilla-pool, lock/mod.rs).
--
-- KEYS[1]  the lock's holder record (hash; expires with the lock)
-- KEYS[2]  the lock's fencing counter (string; never expires)
-- ARGV[1]  owner id
-- ARGV[2]  lease id (unique per acquisition attempt; proves ownership)
-- ARGV[3]  host name of the caller
-- ARGV[4]  process id of the caller
-- ARGV[5]  time to live, milliseconds
--
-- Returns  {1, token, now_ms}                          acquired
--          {0, owner, host, pid, token, pttl_ms}       held by someone
--
-- Tokens are max(last token + 1, server time in µs): they keep increasing
-- when Redis loses the counter (empty restart) and when it goes back in
-- time (a rollback restores an older counter, but server time has moved on
-- past every token issued since).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  local h = redis.call('HMGET', KEYS[1], 'owner', 'host', 'pid', 'token')
  return {0, h[1] or '', h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1])}
end
local token = math.max((tonumber(redis.call('GET', KEYS[2]) or '0') or 0) + 1, now_us)
redis.call('SET', KEYS[2], string.format('%.0f', token))
redis.call('HSET', KEYS[1],
  'owner', ARGV[1], 'lease', ARGV[2], 'host', ARGV[3], 'pid', ARGV[4],
  'acquired_at', string.format('%.0f', now), 'heartbeat_at', string.format('%.0f', now),
  'token', string.format('%.0f', token))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, token, now}
