-- snapshot: the map's revision and its first page of fields, read
-- atomically, followed by a sync marker on the channel so the reading
-- replica knows which messages came after this read. A map larger than a
-- page is read on with HSCAN from the cursor returned (see snapshot.rs).
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 marker token, 2 fields per page (HSCAN's COUNT)
-- returns: {revision (string), cursor (string, "0": complete),
--           {field1, value1, field2, value2, ...}}
local rev = redis.call('GET', KEYS[2]) or '0'
local page = redis.call('HSCAN', KEYS[1], '0', 'COUNT', ARGV[2])
redis.call('SPUBLISH', KEYS[3], rev .. ':y:' .. #ARGV[1] .. ':' .. ARGV[1])
return {rev, page[1], page[2]}
