-- Deletes a consumer from a group only when it has no pending entries, so
-- no event is ever dropped with it.
-- KEYS[1]  stream key
-- ARGV[1]  group
-- ARGV[2]  consumer
-- Returns 1 when deleted (or absent), 0 when it still has pending entries.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 1
end
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if not ok then
  return 1
end
if #pending > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
