-- remove: removes every occurrence of the given values from a list field; a
-- list left empty deletes the field.
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field, 5.. values to remove (bounded by the caller)
-- returns: the resulting list as JSON, or nil when the field is (now) missing;
--          error "MALFORMED ..." when the stored value is not a JSON array of strings
rmap_floor(ARGV[3])
local cur = redis.call('HGET', KEYS[1], ARGV[4])
if not cur then
  return nil
end
local list, reason = rmap_decode_list(cur)
if not list then
  return redis.error_reply('MALFORMED ' .. reason)
end
local drop = {}
for i = 5, #ARGV do
  drop[ARGV[i]] = true
end
local kept = {}
for _, v in ipairs(list) do
  if not drop[v] then
    kept[#kept + 1] = v
  end
end
if #kept == #list then
  return cur
end
if #kept == 0 then
  rmap_del(KEYS[1], KEYS[2], KEYS[3], ARGV[4])
  rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
  return nil
end
local encoded = cjson.encode(kept)
rmap_set(KEYS[1], KEYS[2], KEYS[3], ARGV[4], encoded)
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return encoded
