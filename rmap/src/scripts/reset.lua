-- reset: deletes every field of the map.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms
-- returns: the new revision
local rev = rmap_reset(KEYS[1], KEYS[2], KEYS[3])
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return rev
