-- The cleanup of a dead worker found no live worker to take one of its
-- jobs: the dead worker's ownership goes and the payload stays, so the
-- orphan sweep requeues the job once a worker joins. Only while the record
-- still names that worker (read here, in Redis, not from a replica), and
-- only while the cleaner's claim on the worker is still its own: a worker
-- that renewed meanwhile cleared the claim and may run the job again (its
-- resume wrote a new record naming it), and a release then would leave
-- that run unknown to Redis, its stops answered without it.
-- KEYS: base, 9 cleanup hash
-- ARGV: base, 4 job key, 5 worker id, 6 the cleaner's node id ('': not a
--       cleanup's release)
-- Returns 'released' | 'changed' | 'claim_lost'
local key = ARGV[4]
if not claim_held(KEYS[9], ARGV[5], ARGV[6]) then return 'claim_lost' end
if owner_of(mget(JOBS, key)) ~= ARGV[5] then return 'changed' end
mdel(JOBS, key)
return 'released'
