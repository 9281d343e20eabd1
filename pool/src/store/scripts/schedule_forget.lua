-- Drops a job from a schedule's job set, only while the caller still leads
-- the schedule (so a deposed leader cannot forget a job the new leader has
-- just started).
-- KEYS[1] the schedule's job set (hash: job key -> fencing token)
-- KEYS[2] the schedule's leader-lease lock (hash with field 'token')
-- ARGV[1] the leader's token, ARGV[2] the job key
-- Returns 1 when dropped, 0 when not in the set, -1 when not the leader.
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return -1
end
return redis.call('HDEL', KEYS[1], ARGV[2])
