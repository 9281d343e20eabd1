-- reset: deletes every field of the map.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision)
-- returns: the new revision
rmap_floor(ARGV[3])
local rev = rmap_reset(KEYS[1], KEYS[2], KEYS[3])
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return rev
