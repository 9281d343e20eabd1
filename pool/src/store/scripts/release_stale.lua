-- After Redis went back in time, a worker drops a record that names it for
-- a job it neither runs nor holds suspended: Redis lost the stop (or the
-- hand-off) that ended the job here. Only while the record is unchanged.
-- The payload goes with the record, so neither cleanup nor the orphan sweep
-- starts the stopped job again (a worker that runs the job after a lost
-- hand-off re-asserts it, restoring the payload) — unless the key's fencing
-- counter is above the record's token: a newer run was issued (a hand-off
-- given back, a job left to the orphan sweep by a worker that holds it but
-- could not re-assert it while the pool recovered), and the payload, of
-- the same admission, may be that run's only copy. It then stays, an
-- orphan, as `stop_stands.lua` leaves it for the same reason. So it does
-- when the worker passed the job on with a newer token since (`handed`):
-- Redis went back to before that hand-off, which may have been made on a
-- primary that stalled through its failover (its token, from that
-- primary, is not in this side's counter), and the payload is then the
-- job's only copy here; the orphan sweep runs it unless the new owner
-- re-asserts it first (chaos soak seed 1556: six jobs ran nowhere).
-- KEYS: base
-- ARGV: base, 4 job key, 5 the record as read ("<worker> <token>"),
--       6 'handed' when the worker passed the job on since, else ''
-- Returns 'released' | 'kept' (record gone, payload left) | 'changed'
local key = ARGV[4]
if mget(JOBS, key) ~= ARGV[5] then return 'changed' end
mdel(JOBS, key)
if ARGV[6] == 'handed' then return 'kept' end
local token = tonumber(string.match(ARGV[5], ' (%d+)$') or '') or 0
local current = tonumber(redis.call('HGET', FENCING, key) or '') or 0
if current > token then return 'kept' end
end_stored_dispatch(key)
return 'released'
