-- A worker re-asserts a job after it was registered again (Redis lost its
-- data, or the worker was cleaned up while cut off).
-- A job it *runs* takes ownership back when nobody else owns or is starting
-- the job and no newer token was issued, restoring the payload if it
-- vanished.
-- A job it had *suspended* on lease loss (not running) never competes with
-- running copies: while the pool recovers from a data loss, another worker
-- that runs the key (the job was moved during the lease loss) may not have
-- re-asserted yet, and its token is unknown to Redis now. So during the
-- recovery window only the payload is restored: the job becomes an orphan,
-- which the orphan sweep requeues (after its grace period, past the window)
-- unless a running copy re-asserted it meanwhile.
-- The orphan is marked at once (its grace starts now, see
-- `sweep_orphans.lua`): the sweep requeues it one grace later wherever
-- its pass is, not only when the pass comes to it.
-- One call re-asserts many jobs of one worker, each as if in a call of
-- its own: a worker with hundreds of jobs is back in Redis in a few calls
-- after a loss, where a call per job left most of them known to it alone
-- for a tenth of a second or more (a crash then lost them).
-- KEYS: base, 9 orphan marks hash
-- ARGV: base, 4 worker id, 5 worker ttl ms, then 4 per job: job key,
--       token, stored payload ("<admitted> <body>"), 'running' |
--       'suspended' | 'yielding' (suspended, and never over another run's
--       record or guard, whatever the tokens: the worker's node wrote to
--       a primary that stalled through its failover, whose tokens came
--       from its own clock on a branch the promoted side never saw)
-- A record or pending guard with an *older* token than the worker's is
-- stale: Redis went back in time and lost the start the worker holds (a
-- hand-off to it, a restart here). The newer token wins, as fencing says.
-- A guard with the worker's own token is the admission of that very start.
-- Returns one status per job, in order: 'ok' | 'lost' (a record of a
-- newer run, or a newer run that ended) | 'pending' (lost to a newer
-- admission or hand-off of the key that has not started yet: the caller
-- remembers what it gave way to, as for a hand-off, in case Redis loses
-- that too) | 'unclaimed' (a newer token and a payload, but no record or
-- guard: an orphan, remembered the same way, as Redis may hold its only
-- copy) | 'orphaned' (payload restored, ownership not taken) |
-- 'superseded <admitted>' (a record or guard of an older dispatch, whose
-- admission stamp is given, over this run with a newer token: that
-- dispatch is marked over, and this run's payload waits for its end to
-- take its place, `wait_for_older_end`; the caller stops it)
local worker, ttl_arg = ARGV[4], ARGV[5]
-- The payload is this run's unless Redis holds one of this admission or
-- a newer one: a payload of an *older* admission (the state Redis went
-- back to, or a hand-off of an older run given back after the loss) goes,
-- or the older run's stop, made to stand later, would take the only copy
-- of this one's, and a move of this run would start the older body.
local function own_payload(key, stored_arg)
  local stored = redis.call('HGET', PAYLOADS, key)
  if not stored or payload_admitted(stored) < payload_admitted(stored_arg) then
    redis.call('HSET', PAYLOADS, key, stored_arg)
  end
end
-- A record or guard with a newer token than this run's, of a dispatch
-- admitted *before* this run's (the payload Redis holds is that older
-- one's): the state Redis went back to showed the older dispatch, which
-- had ended before this one was admitted, and a cleanup moved it on with
-- a token from the clock. It is over; this run's dispatch is not, and
-- waits for the older run to end rather than be given up to it (chaos
-- soak `chaos_short_scheduled_jobs` seed 45: `sched-19` given up to a
-- finished dispatch's moved run, then unknown to Redis once that run was
-- stopped, and admitted again). Not for a yielding worker, whose run's
-- admission this side may never have seen.
local function superseding(key, stored_arg, state_arg)
  if state_arg == 'yielding' then return nil end
  local older = supersede_older(key, stored_arg)
  return older and string.format('superseded %d', older)
end
local function reassert_one(key, token_arg, stored_arg, state_arg)
  local mine = tonumber(token_arg)
  local j = mget(JOBS, key)
  if j then
    local recorded = tonumber(string.match(j, ' (%d+)$') or '')
    if owner_of(j) == worker then
      if recorded and recorded < mine then
        redis.call('HSET', FENCING, key, string.format('%d',
          math.max(mine, tonumber(redis.call('HGET', FENCING, key) or '0') or 0)))
        mset(JOBS, key, worker .. ' ' .. token_arg)
      end
      -- A start recorded while the pool recovered from a data loss has no
      -- payload in Redis: the worker's copy is the only one. Its own older
      -- record (a run here stopped since, which Redis went back to) may
      -- come with that older run's payload.
      own_payload(key, stored_arg)
      return 'ok'
    end
    if state_arg == 'yielding' or not (recorded and recorded < mine) then
      return superseding(key, stored_arg, state_arg) or 'lost'
    end
    mdel(JOBS, key)
  end
  local p = mget(PENDING, key)
  if p then
    -- A guard with this worker's own token is its own start, admitted before
    -- the state Redis went back to and started after it: take it.
    local guarded = tonumber(string.match(p, '^(%d+)') or '')
    if not (guarded and guarded <= mine) then
      return superseding(key, stored_arg, state_arg) or 'pending'
    end
    if state_arg == 'yielding' and guarded ~= mine then return 'pending' end
    mdel(PENDING, key)
  end
  local current = tonumber(redis.call('HGET', FENCING, key) or '0')
  -- Yielding, this worker's token is not comparable with this side's. A
  -- token this side issued for the key at or after this dispatch's
  -- admission, with no record, guard or payload left, is a run of the
  -- dispatch that ended here (moved, then finished, failed for good or
  -- stopped): not brought back (chaos soak seed 1472: a restart the woken
  -- primary ran gave the suspended copy a token above the tombstone, and
  -- the job that had failed for good here ran again). An admission this
  -- side never saw has no token here from after it.
  if state_arg == 'yielding' and ended_here(key, current, stored_arg) then
    return 'lost'
  end
  -- A newer token was issued, and Redis shows neither its run nor its
  -- start. With a payload, that is an orphan (given back by a new owner
  -- that found its move lost): Redis may hold its only copy. Without one,
  -- the newer run ended (only an end takes the payload away).
  -- Unless every end Redis knows of the key was of an older dispatch
  -- (`note_dispatch_end`): after a rollback a run of an older dispatch, moved and then ended, takes
  -- tokens from the clock above this run of a newer one, whose admission
  -- Redis lost (chaos soak seed 1645). This run then goes on, or is left
  -- to the orphan sweep, as if its token were the latest; the counter
  -- stays where it is.
  if current > mine then
    if redis.call('HEXISTS', PAYLOADS, key) == 1 then return 'unclaimed' end
    if state_arg == 'yielding'
        or not only_older_ended(key, payload_admitted(stored_arg)) then
      return 'lost'
    end
  else
    -- This run's token was issued: the counter never stays below it (a
    -- hand-off of an older run, given back after the loss, then sees it
    -- is not the latest).
    redis.call('HSET', FENCING, key, token_arg)
  end
  own_payload(key, stored_arg)
  if state_arg ~= 'running' and recovering(tonumber(ttl_arg)) then
    redis.call('HSET', KEYS[9], key,
      string.format('%d - ', now_ms()) .. redis.call('HGET', FENCING, key))
    return 'orphaned'
  end
  mset(JOBS, key, worker .. ' ' .. token_arg)
  return 'ok'
end
local statuses = {}
for i = 6, #ARGV, 4 do
  statuses[#statuses + 1] = reassert_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
end
return statuses
