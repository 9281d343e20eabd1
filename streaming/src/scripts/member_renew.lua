-- Renews a sink member's keep-alive with Redis server time.
-- KEYS[1]  members hash
-- ARGV[1]  member id
-- Returns the server time in ms that was written.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], tostring(now))
return now
