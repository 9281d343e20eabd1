-- destroy: deletes every field (announced as a reset), then the map's keys.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: none
-- returns: the last revision
local rev = rmap_reset(KEYS[1], KEYS[2], KEYS[3])
redis.call('DEL', KEYS[1], KEYS[2])
return rev
