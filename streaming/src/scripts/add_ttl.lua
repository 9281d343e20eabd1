-- Adds an event and sets the stream key's expiry (absolute or sliding).
-- (The prelude is prepended.)
-- KEYS[1]  stream key
-- ARGV[1]  event name
-- ARGV[2]  payload
-- ARGV[3]  maxlen (0 = no trimming)
-- ARGV[4]  '1' when a topic is given, else '0'
-- ARGV[5]  topic (ignored when ARGV[4] is '0')
-- ARGV[6]  '1' = only if the stream exists
-- ARGV[7]  ttl in ms
-- ARGV[8]  'a' = absolute (set only when the key has no expiry), 's' = sliding
-- Returns the new id, or false when ARGV[6] is '1' and the stream is absent.
local topic = false
if ARGV[4] == '1' then
  topic = ARGV[5]
end
local id
if ARGV[6] == '1' then
  id = stream_add_if_exists(KEYS[1], ARGV[1], ARGV[2], ARGV[3], topic)
else
  id = stream_add(KEYS[1], ARGV[1], ARGV[2], ARGV[3], topic)
end
if not id then
  return false
end
if ARGV[8] == 's' or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
end
return id
