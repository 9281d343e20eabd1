-- Removes a member only if its keep-alive still has the expected value
-- (so a member that renewed meanwhile is kept).
-- KEYS[1]  members hash
-- ARGV[1]  member id
-- ARGV[2]  expected keep-alive value
-- Returns 1 when removed, else 0.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
