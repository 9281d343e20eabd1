-- After Redis went back in time, a worker gives back the payload of a job
-- it handed off lately, in case the rollback lost the hand-off before the
-- new owner started the job (the job would run nowhere, and Redis may not
-- know it any more). Only when Redis went back to *before this hand-off*
-- and nothing else happened to the key since:
-- * its fencing counter is there and below the token the hand-off issued
--   (the hand-off wrote that token with its start entry, atomically: a
--   counter at or above it means the hand-off, or something newer — a
--   start, a stop's tombstone — survived; no counter means Redis lost the
--   key altogether, as in an empty restart, where giving a payload back
--   could start again a job stopped since on a worker that died: the
--   workers that run a job re-assert it then);
-- * no owner record and no pending guard (someone runs or starts it, or
--   will re-assert it over a stale record).
-- The job is then an orphan: the orphan sweep requeues it after its grace
-- period, unless the new owner runs it and re-asserts it first. An
-- existing payload is kept.
-- KEYS: base
-- ARGV: base, 4 job key, 5 the token the hand-off issued, 6 the stored
--       payload ("<created_ms> <body>")
-- Returns 'restored' | 'kept' (owned, pending or its payload is there) |
--       'current' (Redis holds the hand-off or something newer, or
--       nothing of the key)
local key = ARGV[4]
local current = tonumber(redis.call('HGET', FENCING, key) or '')
if not current or current >= tonumber(ARGV[5]) then return 'current' end
if mget(JOBS, key) or mget(PENDING, key) then return 'kept' end
if redis.call('HSETNX', PAYLOADS, key, ARGV[6]) == 0 then return 'kept' end
return 'restored'
