-- set: sets a field.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode ('', 'a', 's'), 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field, 5 value
-- returns: {revision, previous value or nil}
rmap_floor(ARGV[3])
local prev = redis.call('HGET', KEYS[1], ARGV[4])
local rev = rmap_set(KEYS[1], KEYS[2], KEYS[3], ARGV[4], ARGV[5])
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return {rev, prev}
