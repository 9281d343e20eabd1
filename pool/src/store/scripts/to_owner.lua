-- Sends a stop or notify request to the current owner of a job.
-- KEYS: base, 9 owner inbox, 10 keep-alive revision (`went_back`),
--       11 keep-alive hash
-- ARGV: base, 4 job key, 5 expected owner, 6 event name, 7 body, 8 maxlen,
--       9 worker ttl ms (the recovery window after a data loss), 10 the
--       revisions the caller has seen (see `went_back`), 11 a dispatch
--       (its payload's creation time, ms; '0': any): only a job of that
--       dispatch is reached, whatever worker runs it now, 12 the least
--       server time (ms) it can be now by the caller's own clock ('':
--       none; see `claim_cleanup.lua`), 13 a schedule leader's fencing
--       token ('': not a schedule's request) whose lease lock is KEYS[12]
-- Returns {'ok'} | {'pending'} (admitted or being moved, not started yet;
--       or Redis lost its data and the job may run on a worker that has
--       not re-asserted it yet; or an orphan a notify waits for; or a
--       stop of a run on a worker that looks dead while the pool
--       recovers) |
--       {'stopped', token} (a stop of an orphan, or of a run on a dead
--       worker: done here; the token left as its tombstone) |
--       {'not_found'} (a notify) |
--       {'not_found', token} (a stop: the token left as its tombstone) |
--       {'moved', owner} | {'not_leader'} (the schedule's leader that
--       asked was deposed: nothing done, as for its admissions)
-- Redis went back in time and no replica may have noticed yet: the record
-- (or its absence) may be older than the run that goes on somewhere; wait
-- for the workers to re-assert what they run.
if ARGV[13] ~= '' and redis.call('HGET', KEYS[12], 'token') ~= ARGV[13] then
  return {'not_leader'}
end
if went_back(ARGV[10], tonumber(ARGV[9]), KEYS[10]) then return {'pending'} end

-- Ends `key` here: record, guard and payload go, and the fencing counter
-- is raised so that no copy of the ended run (token `ended`) re-asserts.
-- A stop `stop_job` asked for takes a new token, above every run issued
-- before it. A stop of one dispatch (`one_dispatch`) raises the counter
-- just above the ended run's token, as `stop_stands.lua` does: after a
-- rollback, a newer dispatch's run may be held by a worker that has not
-- re-asserted it yet, and a token from the clock would refuse it (chaos
-- soak seed 1591 on `b0c8145`, which ended such stops while the pool
-- recovered: 14 runs of newer dispatches lost so).
local function end_here(key, ended, one_dispatch)
  mdel(JOBS, key)
  if mget(PENDING, key) then mdel(PENDING, key) end
  redis.call('HDEL', PAYLOADS, key)
  local text
  if one_dispatch then
    text = string.format('%d', ended + 1)
    local current = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
    if current <= ended then keep_token(key, text) end
    note_dispatch_end(key, stamp_us(tonumber(ARGV[11] or '0') or 0))
  else
    local _
    _, text = next_token(key, ended + 1)
    note_dispatch_end(key, tonumber(text))
  end
  take_up_waiting(key)
  return {'stopped', text}
end

-- A stop of a run on a worker Redis judges dead (registered, silent for
-- over `ttl` by the smaller of `TIME` and the caller's floor, as
-- `claim_cleanup.lua` judges): nothing reads that worker's inbox, and its
-- lease lapsed with its silence, so the run stopped with it. The stop is
-- carried out here (record, guard and payload go; a new token is the
-- tombstone), before a cleanup moves the run to a live worker that would
-- start it after the stop was answered (chaos soak seed 1591). While the
-- pool recovers nothing is taken ({'pending'}: the caller asks again, not
-- queueing at a worker that may never read it): a keep-alive brought back
-- from an older state looks stale while its worker lives, the record may
-- be older than a run that has not re-asserted yet, and what a recovery
-- gives back (a hand-off's payload, a suspended run left to the orphan
-- sweep) could bring a removed run back unseen.
-- `whole_dispatch`: a stop of one dispatch (a stop answered before and
-- undone, or an end made to stand).
-- Returns the reply, or nil when the worker is not judged dead.
local function stop_on_dead_worker(key, owner, run, ttl, whole_dispatch)
  local registration = mget(WORKERS, owner)
  if not registration then return nil end
  local now = now_ms()
  local judged = math.min(now, tonumber(ARGV[12] or '') or now)
  if judged - silent_since(owner, registration, KEYS[11], ttl) <= ttl then return nil end
  if recovering(ttl) then return {'pending'} end
  return end_here(key, run, whole_dispatch)
end
-- One dispatch only: the end of a run recorded on a primary that stalled
-- through its failover, made to stand on the promoted side, where a
-- cleanup may have moved that run to another worker. A moved job keeps
-- its payload; another dispatch of the key, or none, is not reached.
local dispatch = tonumber(ARGV[11] or '0') or 0
if dispatch > 0 then
  local stored = redis.call('HGET', PAYLOADS, ARGV[4])
  if not stored or payload_admitted(stored) ~= stamp_us(dispatch) then
    -- The dispatch may wait for an older one's run to end
    -- (`wait_for_older_end`): it ends here, and does not take that run's
    -- place.
    local waiting = redis.call('HGET', FENCING, WAITING .. ARGV[4])
    if ARGV[6] == 'stop' and waiting and payload_admitted(waiting) == stamp_us(dispatch) then
      redis.call('HDEL', FENCING, WAITING .. ARGV[4])
      note_dispatch_end(ARGV[4], stamp_us(dispatch))
    end
    return {'not_found'}
  end
end
local j = mget(JOBS, ARGV[4])
if not j then
  if mget(PENDING, ARGV[4]) then
    -- A start of a stopped dispatch not claimed yet (e.g. in the inbox of
    -- a worker that died, which a cleanup would move to a live one): its
    -- guard goes, so no worker's claim or start record of it holds.
    if ARGV[6] == 'stop' and dispatch > 0 and not recovering(tonumber(ARGV[9])) then
      local guard = tonumber(string.match(mget(PENDING, ARGV[4]), '^(%d+)') or '') or 0
      return end_here(ARGV[4], guard, true)
    end
    return {'pending'}
  end
  if recovering(tonumber(ARGV[9])) then return {'pending'} end
  if redis.call('HEXISTS', PAYLOADS, ARGV[4]) == 1 then
    -- An orphan: its payload waits for the orphan sweep to run it again
    -- (e.g. a job suspended on lease loss and left to the sweep after a
    -- data loss), so it is not "not found". A stop ends it here: the
    -- payload goes, and a new fencing token is a tombstone that no older
    -- copy can re-assert over (reassert.lua refuses a token below it).
    if ARGV[6] == 'stop' then
      redis.call('HDEL', PAYLOADS, ARGV[4])
      local _, text = next_token(ARGV[4])
      note_dispatch_end(ARGV[4], tonumber(text))
      take_up_waiting(ARGV[4])
      return {'stopped', text}
    end
    return {'pending'}
  end
  -- A stop of a key Redis knows nothing of leaves a tombstone token: a
  -- copy held by a worker that was cut off while Redis lost the record
  -- must not re-assert over the answer (reassert.lua refuses a token
  -- below it). The caller keeps the token: another loss of Redis's data
  -- takes the tombstone too, and the caller then makes the stop stand
  -- again (stop_stands.lua).
  if ARGV[6] == 'stop' then
    local _, text = next_token(ARGV[4])
    note_dispatch_end(ARGV[4], tonumber(text))
    return {'not_found', text}
  end
  return {'not_found'}
end
local owner = owner_of(j)
if owner ~= ARGV[5] then return {'moved', owner} end
local run = tonumber(string.match(j, ' (%d+)$') or '') or 0
if ARGV[6] == 'stop' then
  local ended = stop_on_dead_worker(ARGV[4], owner, run, tonumber(ARGV[9]), dispatch > 0)
  if ended then return ended end
end
-- A stop names the run it is for ("stop <token>"): the same entry read
-- again after Redis went back in time, or moved on by a cleanup, must not
-- stop a newer run of the key. A stop of one dispatch names that dispatch
-- too ("stop <token> <admitted>"): after a rollback the payload read above
-- may be an older dispatch's beside a newer dispatch's run, which its
-- worker has not re-asserted yet with its own payload; the worker leaves a
-- run of another dispatch alone (chaos soak seed 1599: an undone stop
-- asked again stopped the newer dispatch's run, which then ran nowhere).
local name = ARGV[6]
if name == 'stop' and dispatch > 0 then
  name = string.format('stop %d %d', run, stamp_us(dispatch))
elseif name == 'stop' then
  name = string.format('stop %d', run)
end
stream_add(KEYS[9], name, ARGV[7], tonumber(ARGV[8]))
return {'ok'}
