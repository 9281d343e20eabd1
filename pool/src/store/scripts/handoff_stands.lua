-- After Redis went back in time or lost its data, a worker gives back the
-- payload of a job it handed off lately, in case the loss took the
-- hand-off before the new owner started the job (the job would run
-- nowhere, and Redis may not know it any more). Only when Redis went back
-- to *before this hand-off* and nothing else happened to the key since:
-- * its fencing counter is below the token the hand-off issued, or gone
--   (the hand-off wrote that token with its start entry, atomically: a
--   counter at or above it means the hand-off, or something newer — a
--   start, a stop's tombstone — survived; no counter means Redis lost the
--   key altogether, as in an empty restart). A stop of the run since, on a
--   worker that died, is made to stand again by the node that asked for it
--   (`stop_stands.lua` raises the counter and removes a payload this gave
--   back), and the orphan sweep waits for every node's recovery;
-- * no owner record and no pending guard (someone runs or starts it, or
--   will re-assert it over a stale record).
-- The job is then an orphan: the orphan sweep requeues it after its grace
-- period, unless the new owner runs it and re-asserts it first. An
-- existing payload is kept when it is of this admission or a newer one;
-- one of an *older* admission (Redis went back to before this one, to an
-- orphan whose run ended since) is replaced, or the orphan sweep would
-- start the older body, and that run's stop, made to stand, would then
-- take the only copy of this job.
-- The orphan is marked at once, as `reassert.lua` does. The key's counter
-- is raised to the hand-off's token, which was issued (as `reassert.lua`
-- does for its run's): a stop of an older run, made to stand later, then
-- sees a newer run and leaves its payload (`stop_stands.lua`).
-- Yielding (the giver's node wrote to a primary that stalled through its
-- failover, as for `reassert.lua`): the hand-off may have been made there,
-- with a token from that primary's clock, on records the promoted side had
-- moved on from. So when this side issued a token for the key at or after
-- this dispatch's admission and holds no record, guard or payload of it,
-- a run of the dispatch ended here and the payload is not given back
-- (chaos soak seed 1481: a cleaner on the woken primary moved a job that
-- had finished on the promoted side, gave it back there after its
-- reconnect, and the orphan sweep ran it again).
-- KEYS: base, 9 orphan marks hash
-- ARGV: base, 4 'yielding' | '', then three per job: job key, the token
--       the hand-off issued, the stored payload ("<admitted> <body>") (a
--       recovery gives back many jobs in a few calls)
-- Returns one status per job: 'restored' | 'kept' (owned, pending, or this
--       payload or a newer one is there) | 'superseded <admitted>' (owned
--       or pending by a run of an older dispatch, admitted at that stamp:
--       marked over, this payload waits for its end, `supersede_older`) |
--       'current' (Redis holds the hand-off or something newer) |
--       'ended' (yielding: a run of this dispatch ended here)
-- A counter at or above the token, with nothing of the key left and
-- every end Redis knows of it of an older dispatch than this one
-- (`note_dispatch_end`), is not "something newer": a rollback took this dispatch's admission,
-- and a run of an older one, moved and ended since, took tokens from the
-- clock above it (chaos soak seed 1645). The payload is given back then
-- too, the counter left where it is.
local yielding = ARGV[4] == 'yielding'
local function stand(key, token, payload)
  -- A record or guard of an older dispatch than this one (Redis went back
  -- to a state that showed it, or went back again after this job waited
  -- for it, `reassert.lua`): this one waits for its end again.
  if not yielding and (mget(JOBS, key) or mget(PENDING, key)) then
    local older = supersede_older(key, payload)
    if older then return string.format('superseded %d', older) end
  end
  local current = tonumber(redis.call('HGET', FENCING, key) or '')
  if current and current >= tonumber(token) then
    if yielding or mget(JOBS, key) or mget(PENDING, key)
        or redis.call('HEXISTS', PAYLOADS, key) == 1
        or not only_older_ended(key, payload_admitted(payload)) then
      return 'current'
    end
  end
  if yielding and ended_here(key, current, payload)
      and not (mget(JOBS, key) or mget(PENDING, key)) then
    return 'ended'
  end
  if not (current and current >= tonumber(token)) then
    redis.call('HSET', FENCING, key, token)
  end
  if mget(JOBS, key) or mget(PENDING, key) then return 'kept' end
  local stored = redis.call('HGET', PAYLOADS, key)
  if stored and payload_admitted(stored) >= payload_admitted(payload) then return 'kept' end
  redis.call('HSET', PAYLOADS, key, payload)
  redis.call('HSET', KEYS[9], key,
    string.format('%d - ', now_ms()) .. (redis.call('HGET', FENCING, key) or '0'))
  return 'restored'
end

local statuses = {}
for i = 5, #ARGV - 2, 3 do
  statuses[#statuses + 1] = stand(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return statuses
