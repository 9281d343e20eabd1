-- After Redis went back in time, a worker gives back the payload of a job
-- it handed off lately, in case the rollback lost the hand-off's start
-- entry before the new owner started it (the job would run nowhere, and
-- Redis may not know it any more). Only when nothing newer happened to
-- the key: no owner record and no pending guard (someone runs or starts
-- it, or will re-assert it over a stale record), and no fencing token
-- above the one the hand-off issued (a newer start, or a stop's
-- tombstone). The job is then an orphan: the orphan sweep requeues it
-- after its grace period, unless the new owner runs it and re-asserts it
-- first. An existing payload is kept.
-- KEYS: base
-- ARGV: base, 4 job key, 5 the token the hand-off issued, 6 the stored
--       payload ("<created_ms> <body>")
-- Returns 'restored' | 'kept' (owned, pending or its payload is there) |
--       'superseded' (a newer token)
local key = ARGV[4]
if mget(JOBS, key) or mget(PENDING, key) then return 'kept' end
local current = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
if current > tonumber(ARGV[5]) then return 'superseded' end
if redis.call('HSETNX', PAYLOADS, key, ARGV[6]) == 0 then return 'kept' end
return 'restored'
