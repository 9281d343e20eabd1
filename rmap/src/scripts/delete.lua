-- delete: deletes a field.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 field
-- returns: the previous value, or nil when the field did not exist
local prev = redis.call('HGET', KEYS[1], ARGV[3])
if prev then
  rmap_del(KEYS[1], KEYS[2], KEYS[3], ARGV[3])
  rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
return prev
