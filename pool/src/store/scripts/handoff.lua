-- Moves a job to another worker: ownership dropped, new fencing token,
-- pending guard set, start enqueued at the target (rebalance, close,
-- requeue of a dead worker's job, orphan requeue).
-- KEYS: base, 9 target inbox, 10 cleanup hash, 11 keepalive hash,
--       12 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 expected owner ('-': the job must be an orphan:
--       no owner, no pending dispatch), 6 target worker, 7 pending ttl ms,
--       8 inbox maxlen, 9 worker ttl ms (the recovery window after a data loss),
--       10 the cleaner's node id when a cleanup moves a dead worker's job
--       ('' otherwise): its claim on the worker must still be its own,
--       11 the revisions the caller has seen (`went_back`) when the expected
--       owner held the job past its lease, or a cleaner moves it ('' otherwise),
--       12 the least server time (ms) it can be now by the caller's own
--       clock ('': unknown), for judging the target's silence (see
--       `worker_current`)
-- Returns {'ok', token} (with the job's stored payload for a cleaner,
--       which remembers the job until its new owner started it: the dead
--       worker cannot give it back after a loss) | {'not_owner'} | {'no_target'} (the target is gone,
--       being cleaned up or drained, silent for over a TTL, or has not
--       renewed since the last data loss: see `worker_current`)
--       | {'no_payload'} (nothing to hand on: the record stays with its
--       worker, which holds the body, except for a cleaner, which releases
--       it)
--       | {'claim_lost'} (a cleanup's claim on the expected owner is not
--       the cleaner's any more: nothing of that worker is its to move)
--       | {'ended'} (a cleaner's or an orphan's move of a dispatch marked
--       over, see `dispatch_over`: ended instead, the record too)
--       | {'recovering'} (an orphan is not requeued while the pool recovers
--       from a data loss: a worker that runs it may not have re-asserted yet;
--       nor a job its owner held past its lease, nor a cleaner's: see below)
local key, expected, target = ARGV[4], ARGV[5], ARGV[6]
if expected == '-' then
  if redis.call('HEXISTS', JOBS[1], key) == 1 or redis.call('HEXISTS', PENDING[1], key) == 1 then
    return {'not_owner'}
  end
  if recovering(tonumber(ARGV[9])) then
    return {'recovering'}
  end
elseif not claim_held(KEYS[10], expected, ARGV[10]) then
  -- The worker came back and cleared a stale claim (it may run the job
  -- again), or another cleaner took the claim over. Checked before the
  -- owner, so the cleaner learns it at its next call and stops.
  return {'claim_lost'}
elseif owner_of(mget(JOBS, key)) ~= expected then
  return {'not_owner'}
elseif ARGV[11] ~= '' and (went_back(ARGV[11], tonumber(ARGV[9]), KEYS[12])
    or recovering(tonumber(ARGV[9]))) then
  -- Past its owner's lease a cleanup may have moved the job, on writes a
  -- rollback took back: the record naming the owner cannot vouch for it
  -- until every running copy has re-asserted (the window's end). A token
  -- issued now would outrank the moved run's, unknown to Redis. A cleanup
  -- claimed before the rollback may have made such moves itself, and the
  -- older hash's listing can name those jobs again.
  return {'recovering'}
end
if not worker_current(target, KEYS[10], KEYS[11], tonumber(ARGV[9]), tonumber(ARGV[12])) then
  return {'no_target'}
end
-- Enqueued first: with nothing to hand on (a start recorded during a
-- recovery leaves a record without its payload, until the owner re-asserts
-- it) enqueue_stored writes nothing, and the record stays with the worker
-- that holds the job's body.
-- A cleaner's or an orphan's move of a dispatch marked over (a stop or end made
-- to stand again after a rollback, see `dispatch_over`) ends it instead.
local token, stored = enqueue_stored(key, KEYS[9], tonumber(ARGV[7]), tonumber(ARGV[8]),
  ARGV[10] ~= '' or expected == '-')
if not token then
  if ARGV[10] ~= '' and expected ~= '-' then
    -- A cleaner's: the dead worker held the body, and the pool has
    -- recovered (above), so it never re-asserted it. The job is gone; its
    -- record goes too, or it would answer every later dispatch of the key
    -- (a worker that comes back re-asserts the run over no record).
    mdel(JOBS, key)
  end
  if stored == 'ended' then return {'ended'} end
  return {'no_payload'}
end
if expected ~= '-' then mdel(JOBS, key) end
if ARGV[10] ~= '' then
  return {'ok', token, stored}
end
return {'ok', token}
