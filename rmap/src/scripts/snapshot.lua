-- snapshot: the map's revision and content, read atomically, followed by a
-- sync marker on the channel so the reading replica knows which messages
-- came after the snapshot.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 marker token
-- returns: {revision (string), {field1, value1, field2, value2, ...}}
local rev = redis.call('GET', KEYS[2]) or '0'
local all = redis.call('HGETALL', KEYS[1])
redis.call('SPUBLISH', KEYS[3], rev .. ':y:' .. #ARGV[1] .. ':' .. ARGV[1])
return {rev, all}
