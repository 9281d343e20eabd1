-- test_and_delete: deletes a field only if its current value equals the expected one.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field, 5 expected value
-- returns: 1 when deleted, 0 when the value differed or was missing
rmap_floor(ARGV[3])
if redis.call('HGET', KEYS[1], ARGV[4]) ~= ARGV[5] then
  return 0
end
local deleted = rmap_del(KEYS[1], KEYS[2], KEYS[3], ARGV[4])
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return deleted
