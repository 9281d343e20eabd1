-- Lists a sink's members with the server time.
-- KEYS[1]  members hash (one field per process in the sink: bounded)
-- Returns {now_ms, {member, keepalive_ms, member, keepalive_ms, ...}}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
