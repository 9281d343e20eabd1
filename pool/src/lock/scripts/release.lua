-- Release a lock held by the caller (flotilla-pool, lock/guard.rs).
--
-- KEYS[1]  the lock's holder record (hash)
-- ARGV[1]  lease id of the caller's acquisition
--
-- Returns  1   released
--          0   not held by this lease; nothing was changed
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
