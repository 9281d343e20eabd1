-- A worker that stopped its jobs on lease loss renewed again: restart a
-- job that is still its own, with a new fencing token. Not while a cleaner
-- has claimed the worker: the cleaner is handing its jobs to other workers
-- (the worker was silent past its TTL), and a restart here would run a key
-- the cleaner is about to start elsewhere. The worker keeps such a job
-- suspended and asks again: the cleaner moves it, or the claim goes (the
-- cleaner finished, or it died and the worker's renewals clear its stale
-- claim) and the job is still this worker's, which no one else would run.
-- Not while the pool recovers from a data loss or a rollback either: the
-- record may be one the lost writes had replaced (the job moved while this
-- worker's lease was lost, and its new owner, which runs it, has not
-- re-asserted it yet). Once the window is over every running copy has
-- re-asserted, and a record still naming this worker is its own.
-- Nor on a state older than the caller has seen (`went_back`: a rollback
-- its node has not noticed yet, which opens the window): the worker's
-- lease lapsed, so a cleanup may have moved the job on writes Redis lost,
-- and the move's run may have been stopped since.
-- KEYS: base, 9 cleanup hash, 10 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 worker id, 6 worker ttl ms (the recovery window
--       a script that finds the pool's epoch gone opens), 7 the revisions
--       the caller has seen (`went_back`)
-- Returns the new token, 'moved' (another owner, or none), 'claimed'
-- (still recorded here, held back by a cleanup claim on the worker) or
-- 'recovering' (still recorded here, held back while the pool recovers).
local key, worker = ARGV[4], ARGV[5]
if owner_of(mget(JOBS, key)) ~= worker then return 'moved' end
if redis.call('HEXISTS', KEYS[9], worker) == 1 then return 'claimed' end
if went_back(ARGV[7], tonumber(ARGV[6]), KEYS[10]) or recovering(tonumber(ARGV[6])) then
  return 'recovering'
end
local token = next_token(key)
-- '%d': Lua prints a number concatenated as is with %.14g, and a 16-digit
-- time-based token would become "1.7953564485967e+15", a record nobody
-- can parse (the job would then be skipped by cleanup and the orphan sweep).
mset(JOBS, key, string.format('%s %d', worker, token))
return token
