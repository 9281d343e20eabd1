-- Records that a worker stopped a job on request: ownership and payload
-- removed, inbox entry removed, dispatcher answered.
-- KEYS: base, 9 worker inbox, 10 reply stream
-- ARGV: base, 4 job key, 5 worker id, 6 inbox entry id, 7 reply request (0),
--       8 the token of the run the worker ran or held (suspended) ('0':
--       none),
--       9 worker ttl ms (the recovery window after a data loss), 10 the
--       token of the run the stop was sent for ('0': not known), 11 the
--       token of the worker's own run it left going on ('0': none; a newer
--       run, or a run of another dispatch than a stop of one dispatch's),
--       12 '1' when the worker held the run past its lease (suspended, or
--       running after the lease lapsed), '0' when it ran under a lease that
--       held or none was held, 13 the admission stamp (µs) of the dispatch
--       a stop of one dispatch was sent for ('0': a stop of the key)
-- The dispatcher's reply is "<request> <status>", with the stopped run's
-- token after 'ok' ("<request> ok <token>"): the dispatcher remembers it,
-- to make the stop stand again if Redis goes back in time (the worker that
-- stopped the run may be gone by then). A 'retry' after the worker stopped
-- its run, or removed a stale record of one, names that run too
-- ("<request> retry <token>"): the stop is done here, whatever the
-- dispatcher finds when it sends it again.
-- Returns 'ok' | 'retry' (the job moved on or is about to start elsewhere,
-- or the pool recovers and its run may not have re-asserted yet, or Redis
-- has no record of the run stopped here: the dispatcher sends the request
-- again). Tombstones (a fencing token above every copy of a stopped run)
-- are left here only where the record names the run stopped here, and
-- otherwise by `to_owner.lua`, for a dispatcher that still waits.
local key = ARGV[4]
local status = 'retry'
local stopped_token = 0
local record = mget(JOBS, key)
local owner = owner_of(record)
local recorded = tonumber(record and string.match(record, ' (%d+)$') or '') or 0
local held = tonumber(ARGV[8]) or 0
local target = tonumber(ARGV[10]) or 0
local kept = tonumber(ARGV[11]) or 0
if kept > 0 then
  -- The worker runs a newer run than the one the stop was sent for, or a
  -- run of another dispatch than the one a stop of one dispatch was sent
  -- for, and left it going on. The record may still name the older run
  -- (Redis went back in time to before the newer start), or the payload
  -- be an older dispatch's: keep both for the run's re-assertion, and let
  -- the dispatcher send the stop again.
  status = 'retry'
elseif record and target > 0 and recorded > target then
  -- The stop was sent for an older run (read again after Redis went back
  -- in time, or moved on by a cleanup): the dispatcher, if it still
  -- waits, sends it again for the run that goes on now.
  status = 'retry'
elseif owner == ARGV[5] and held == 0 and recovering(tonumber(ARGV[9])) then
  -- A record naming a worker that does not hold the job, while the pool
  -- recovers from Redis going back in time: it may predate the hand-off
  -- or restart of a run that goes on elsewhere and has not re-asserted
  -- yet. Ask again once it has (stopping here would be undone by it).
  status = 'retry'
elseif owner == ARGV[5] and held > 0 then
  mdel(JOBS, key)
  redis.call('HDEL', PAYLOADS, key)
  -- A tombstone: a token above every run of the key issued before this
  -- stop. While the record names this run no admission of the key can
  -- have come after it, but a run issued on writes a rollback lost (a
  -- cleanup's move while this worker was cut off) may still be held by
  -- a worker that has not re-asserted it; the stop ends that run too. The
  -- reply carries the tombstone, which the dispatcher makes stand again.
  local _, text = next_token(key, math.max(recorded, held) + 1)
  stopped_token = tonumber(text)
  -- A stop of one dispatch ended that dispatch alone: a newer one, held by
  -- a worker under a token below this tombstone (Redis lost its
  -- admission), is not over. A stop of the key ended every dispatch
  -- admitted before it (`note_dispatch_end`).
  local dispatch = tonumber(ARGV[13] or '0') or 0
  note_dispatch_end(key, dispatch > 0 and dispatch or stopped_token)
  take_up_waiting(key)
  -- A run held past the worker's lease (suspended) may have been moved by a
  -- cleanup on writes a rollback lost, and the moved run may still be
  -- going on: while the pool recovers the dispatcher sends the stop again
  -- once the runs have re-asserted, and is answered then, not before that
  -- run has ended. A run that went on here under a lease that held cannot
  -- have been moved, so no other run of the key can be going on.
  if ARGV[12] == '1' and recovering(tonumber(ARGV[9])) then
    status = 'retry'
  else
    status = 'ok'
  end
elseif owner == ARGV[5] then
  -- A stale record: the worker holds no run of the key. It goes, and the
  -- dispatcher sends the stop again, to find the run elsewhere or leave
  -- the tombstone itself (`to_owner.lua`); the reply names the recorded
  -- run, so that "not found" then means the stop is done.
  mdel(JOBS, key)
  end_stored_dispatch(key)
  stopped_token = recorded
  status = 'retry'
elseif owner or mget(PENDING, key) then
  status = 'retry'
else
  -- No record and no guard. If the worker stopped its run, Redis lost the
  -- run's record (an empty restart, a rollback) after the stop was routed
  -- here, and the reply names the run stopped here. Either way the
  -- dispatcher, if it still waits, sends the stop again: while the pool
  -- recovers it waits for the runs to re-assert, then stops whatever
  -- runs the key or leaves a tombstone (`to_owner.lua`).
  -- No tombstone from here: this worker may have been cut off since the
  -- stop was routed, the stop answered meanwhile by the run's next owner,
  -- and the key admitted again, its record lost with the same data; a
  -- token issued now would be above that newer run's and refuse its
  -- re-assertion (chaos CI, seed 7 with --overlap).
  stopped_token = held
  status = 'retry'
end
stream_remove(KEYS[9], ARGV[6])
if ARGV[7] ~= '0' then
  local answer = ARGV[7] .. ' ' .. status
  if stopped_token > 0 then answer = answer .. string.format(' %d', stopped_token) end
  stream_add(KEYS[10], 'reply', answer, 1000)
end
return status
