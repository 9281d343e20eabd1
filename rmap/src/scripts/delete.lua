-- delete: deletes a field.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field
-- returns: the previous value, or nil when the field did not exist
rmap_floor(ARGV[3])
local prev = redis.call('HGET', KEYS[1], ARGV[4])
if prev then
  rmap_del(KEYS[1], KEYS[2], KEYS[3], ARGV[4])
  rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
return prev
