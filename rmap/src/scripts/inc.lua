-- inc: adds an integer to a field (a missing field counts as 0).
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field, 5 increment (integer)
-- returns: the new value as a string; error "MALFORMED ..." when the stored
--          value is not an integer or the result overflows
rmap_floor(ARGV[3])
local r = redis.pcall('HINCRBY', KEYS[1], ARGV[4], ARGV[5])
if type(r) == 'table' and r.err then
  return redis.error_reply('MALFORMED ' .. r.err)
end
local value = redis.call('HGET', KEYS[1], ARGV[4])
rmap_publish(KEYS[2], KEYS[3], 's', ARGV[4], value)
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return value
