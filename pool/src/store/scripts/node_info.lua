-- Records what a node is, as it joins: its info object plus the join time
-- on server time, so that inspectors show its version and age.
-- KEYS[1] the pool's node info hash
-- ARGV[1] node id, ARGV[2] info (JSON object)
-- Returns the join time (server ms).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local info = cjson.decode(ARGV[2])
info['joined_at_ms'] = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(info))
return now
