-- append: appends values to a list field (a JSON array of strings).
-- KEYS: 1 hash, 2 revision, 3 channel
-- ARGV: 1 ttl mode, 2 ttl ms, 3 revision floor (the caller's replica revision), 4 field, 5 unique ('1': skip values already
--       present), 6.. values to append (bounded by the caller)
-- returns: the resulting list as JSON (nil when the field is missing and
--          nothing was added); error "MALFORMED ..." when the stored value is
--          not a JSON array of strings
rmap_floor(ARGV[3])
local cur = redis.call('HGET', KEYS[1], ARGV[4])
local list = {}
if cur then
  local decoded, reason = rmap_decode_list(cur)
  if not decoded then
    return redis.error_reply('MALFORMED ' .. reason)
  end
  list = decoded
end
local unique = ARGV[5] == '1'
local seen = {}
if unique then
  for _, v in ipairs(list) do
    seen[v] = true
  end
end
local added = 0
for i = 6, #ARGV do
  local v = ARGV[i]
  if not (unique and seen[v]) then
    list[#list + 1] = v
    seen[v] = true
    added = added + 1
  end
end
if added == 0 then
  return cur
end
local encoded = cjson.encode(list)
rmap_set(KEYS[1], KEYS[2], KEYS[3], ARGV[4], encoded)
rmap_ttl(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return encoded
