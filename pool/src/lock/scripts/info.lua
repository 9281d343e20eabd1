-- Read a lock's holder record (flotilla-pool, lock/mod.rs).
--
-- KEYS[1]  the lock's holder record (hash)
--
-- Returns  {}                                            free
--          {owner, host, pid, acquired_at_ms, heartbeat_at_ms, token,
--           pttl_ms, now_ms}                             held
--          (times are Redis server time, ms since the Unix epoch)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'owner', 'host', 'pid', 'acquired_at', 'heartbeat_at', 'token')
return {h[1] or '', h[2] or '', h[3] or '', h[4] or '', h[5] or '', h[6] or '',
  redis.call('PTTL', KEYS[1]), now}
