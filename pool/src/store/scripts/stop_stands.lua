-- After Redis went back in time, a worker makes a stop it carried out
-- stand again: Redis may have lost it, and the older state it went back to
-- may show the stopped run (or an older one) as running, pending or
-- orphaned — which the cleanup of a dead worker or the orphan sweep would
-- start again. Whatever Redis shows for `key` at or below the stopped run's
-- token goes (record, pending guard, and the payload when it is that old),
-- and the fencing counter is raised above the token, so no copy of those
-- runs can re-assert. A newer record or guard (a dispatch after the stop)
-- is left, and so is the payload while the counter is above the token: a
-- newer run was issued (a hand-off given back, a suspended run left to the
-- orphan sweep: both raise the counter to their token), and the payload,
-- of the same admission as the stopped run, is that run's only copy.
-- A stop `stop_job` asked for (`whole`) ended its whole dispatch, though:
-- a newer run of that dispatch was issued after the stop, on the state
-- Redis went back to (a cleanup moved the stopped run from a dead worker
-- before the stop stood again; the nodes that remembered it were cut off
-- or gone). It is not removed here (its worker would run on): the caller
-- stops it through its worker, as `stop_job` does ('undone'), and the
-- dispatch is marked over (`mark_dispatch_over`): a cleanup of a dead
-- worker running it, or the orphan sweep, ends it instead of moving it on.
-- A node that wrote to a primary that stalled through its failover
-- (`yielding`) carried out some of its stops there, under tokens from that
-- server's clock on a branch the promoted side never saw: larger than the
-- tokens of runs the promoted side issued meanwhile, which they do not
-- outrank. Such a stop leaves every record and guard (their owners settle
-- them as they re-assert), as a yielding re-assertion does (chaos soak seed
-- 1562: a worker's stop made on the woken primary took the record of the
-- run the promoted side had moved the job to, its worker ran on, and a
-- `stop_job` asked there again found nothing to stop).
-- KEYS: base
-- ARGV: base, 4 'yielding' | '', then four per stop: job key, fencing token of the stopped
-- run, '1' for the end of a whole dispatch (a stop `stop_job` asked for, a
-- run a worker finished or failed for good, which Redis recorded as the
-- dispatch's end) ('0': a run a worker stopped or ended, whose dispatch
-- may go on), and the admission stamp (µs) of the dispatch the stop ended
-- when it ended one dispatch ('0': every dispatch admitted before the
-- stopped token, as a stop of the key does) (a recovery makes many stops
-- stand in a few calls: until they stand, a crash of the node that
-- remembers them takes them along)
-- Returns one status per stop: 'removed' | 'newer' | 'none' |
-- 'undone <admitted>' (a newer run of the stopped dispatch, whose
-- admission stamp, µs, is given)
-- 'undone <admitted>' when the payload Redis holds for `key` is of the
-- stopped run's dispatch, else nil. Its admission stamp is the token its
-- admission issued (`admit.lua`): at or below the stopped run's token for
-- that dispatch, above it for any dispatch admitted after the stop, even
-- within the same millisecond.
local function undone(key, stopped, bound)
  local stored = redis.call('HGET', PAYLOADS, key)
  if not stored then return nil end
  -- A stamp in ms (written by an earlier build) names no single dispatch.
  local admitted = tonumber(string.match(stored, '^(%d+) ') or '') or 0
  if stamp_is_exact(admitted) and admitted <= bound then
    -- The run issued after the stop goes on until its worker stops it; a
    -- cleanup or the orphan sweep that would issue another ends the
    -- dispatch instead (its worker may be dead).
    mark_dispatch_over(key, bound)
    return string.format('undone %d', admitted)
  end
  return nil
end

local yielding = ARGV[4] == 'yielding'

-- `bound`: every dispatch admitted at or before it is what the stop ended
-- (the stopped run's own dispatch's stamp, for a stop of one dispatch or a
-- worker's end of its run; the stop's token, for a stop of the key).
local function stand(key, stopped, whole, bound)
  local j = mget(JOBS, key)
  local p = mget(PENDING, key)
  local recorded = j and tonumber(string.match(j, ' (%d+)$') or '') or 0
  local guarded = p and tonumber(string.match(p, '^(%d+)') or '') or 0
  if whole then note_dispatch_end(key, bound) end
  if recorded > stopped or guarded > stopped or (yielding and (j or p)) then
    return (whole and undone(key, stopped, bound)) or 'newer'
  end
  local current = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
  -- A dispatch admitted after the one the stop ended, whose runs took
  -- tokens below the stopped run's (a rollback took its admission; the
  -- stopped run, of an older dispatch, was moved after it with a token from
  -- the clock): its record, guard and payload stay, and its runs are not
  -- fenced off (chaos CI seed 7: its orphan's payload taken by the stop of
  -- an older dispatch's moved run, made to stand).
  if bound < stopped then
    local stored = redis.call('HGET', PAYLOADS, key)
    if stored and stamp_is_exact(payload_admitted(stored))
        and payload_admitted(stored) > bound then
      return 'newer'
    end
  end
  local removed = false
  if j then mdel(JOBS, key); removed = true end
  if p then mdel(PENDING, key); removed = true end
  if whole and current > stopped then
    -- An orphan of the stopped dispatch with a run issued after the stop
    -- (a hand-off given back, a suspended run left to the sweep).
    local again = undone(key, stopped, bound)
    if again then return again end
  end
  local stored = current <= stopped and redis.call('HGET', PAYLOADS, key)
  if stored then
    -- A payload admitted after the stop (its record or guard lost, or not
    -- re-asserted yet) has a stamp above the stopped run's token, which
    -- was issued at or after that run's own admission.
    if removed or payload_admitted(stored) <= bound then
      redis.call('HDEL', PAYLOADS, key)
      note_dispatch_end(key, payload_admitted(stored))
      take_up_waiting(key)
      removed = true
    end
  end
  if current <= stopped then
    redis.call('HSET', FENCING, key, string.format('%d', stopped + 1))
  end
  if removed then return 'removed' end
  return 'none'
end

local statuses = {}
for i = 5, #ARGV - 3, 4 do
  local stopped = tonumber(ARGV[i + 1]) or 0
  local bound = tonumber(ARGV[i + 3]) or 0
  if bound <= 0 or bound > stopped then bound = stopped end
  statuses[#statuses + 1] = stand(ARGV[i], stopped, ARGV[i + 2] == '1', bound)
end
return statuses
