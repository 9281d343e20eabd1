-- The cleanup of a dead worker found no live worker to take one of its
-- jobs: the dead worker's ownership goes and the payload stays, so the
-- orphan sweep requeues the job once a worker joins. Only while the record
-- still names that worker (read here, in Redis, not from a replica).
-- KEYS: base
-- ARGV: base, 4 job key, 5 worker id
-- Returns 'released' | 'changed'
local key = ARGV[4]
if owner_of(mget(JOBS, key)) ~= ARGV[5] then return 'changed' end
mdel(JOBS, key)
return 'released'
