-- Extend a lock held by the caller (flotilla-pool, lock/guard.rs).
--
-- KEYS[1]  the lock's holder record (hash)
-- ARGV[1]  lease id of the caller's acquisition
-- ARGV[2]  time to live, milliseconds
--
-- Returns  {1, now_ms}   refreshed (heartbeat_at = now_ms, TTL reset)
--          {0}           not held by this lease (expired or someone else's);
--                        nothing was changed
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then
  return {0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'heartbeat_at', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, now}
