-- A handler refused to start a job: drop the admission and answer.
-- KEYS: base, 9 worker inbox, 10 reply stream
-- ARGV: base, 4 job key, 5 token, 6 inbox entry id, 7 reply request (0: none),
--       8 error text
-- Returns 'ok'
local key, token = ARGV[4], ARGV[5]
local p = mget(PENDING, key)
if p and string.sub(p, 1, #token + 1) == token .. ' ' then
  mdel(PENDING, key)
  redis.call('HDEL', PAYLOADS, key)
end
stream_remove(KEYS[9], ARGV[6])
if ARGV[7] ~= '0' then
  stream_add(KEYS[10], 'reply', ARGV[7] .. ' failed ' .. ARGV[8], 1000)
end
return 'ok'
