-- After Redis went back in time, a worker drops a record that names it for
-- a job it neither runs nor holds suspended: Redis lost the stop (or the
-- hand-off) that ended the job here. The record goes with the payload, so
-- neither cleanup nor the orphan sweep starts the stopped job again; a
-- worker that runs the job after a lost hand-off re-asserts it (restoring
-- the payload). Only while the record is unchanged.
-- KEYS: base
-- ARGV: base, 4 job key, 5 the record as read ("<worker> <token>")
-- Returns 'released' | 'changed'
local key = ARGV[4]
if mget(JOBS, key) ~= ARGV[5] then return 'changed' end
mdel(JOBS, key)
redis.call('HDEL', PAYLOADS, key)
return 'released'
