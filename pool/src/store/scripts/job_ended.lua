-- Records how a run ended on its own, while Redis still names this run
-- (worker and token) the job's owner: finished (the job leaves the pool),
-- or failed (restart after the next backoff delay, or failed for good).
-- KEYS: base, 9 failures hash, 10 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 worker id, 6 run token, 7 'finished' | 'failed',
--       8 error text, 9 'chain' | 'reset' (a run that lasted long enough
--       starts the count over), 10 backoff delays in ms, space-separated
--       (restart n waits delay n; past the last one the job has failed),
--       11 worker ttl ms (the recovery window), 12 the revisions the worker's
--       node has seen (`went_back`) when the run went on past the worker's
--       lease ('' otherwise)
-- Returns {'finished', tombstone} | {'restarting', n, delay ms} |
--       {'failed', n, tombstone} (the token issued at the end: every run of
--       the key issued before it is over) |
--       {'moved'} (Redis names another run: nothing changed) | {'retry'}
--       (a run past its lease while the pool recovers: nothing changed)
-- Failure record: "<state> <n> <token> <at_ms> <error>", state 'restarting'
-- (run <token> failed, restart due at <at_ms>), 'running' (the restart
-- <token> runs; see job_restart.lua) or 'failed' (at <at_ms>).
-- The same call again answers as the first did: a client resends a call
-- whose reply a dropped connection lost, and the first may have ended
-- the job (record, payload and failure count gone) or counted this
-- failure already; answered 'moved' or counted twice, the worker tried to
-- restart a job that had failed for good and never reported its end
-- (chaos soak seed 1579, job-3354), or gave up a restart early.
local key = ARGV[4]
local run = tonumber(ARGV[6]) or 0
local record = mget(JOBS, key)
if record ~= ARGV[5] .. ' ' .. ARGV[6] then
  -- Ended here already: no record and no payload (no dispatch of the key
  -- since), a tombstone above this run, and for a failure the final
  -- failure record of this very run. A finish leaves no record of its
  -- own; a stop that came first ends the job the same way, and its answer
  -- is the same: the job left the pool.
  if record or redis.call('HEXISTS', PAYLOADS, key) == 1 then
    return {'moved'}
  end
  local issued = redis.call('HGET', FENCING, key)
  if (tonumber(issued or '') or 0) <= run then
    return {'moved'}
  end
  local failure = redis.call('HGET', KEYS[9], key)
  if ARGV[7] == 'finished' and not failure then
    return {'finished', issued}
  end
  local count, token = string.match(failure or '', '^failed (%d+) (%d+) ')
  if ARGV[7] == 'failed' and token == ARGV[6] then
    return {'failed', tonumber(count), issued}
  end
  return {'moved'}
end
-- Past the worker's lease a cleanup may have moved the job, on writes a
-- rollback took back: the record naming this run then hides a newer run
-- elsewhere that has not re-asserted yet, and the end of this one would
-- end the job under it (it would run on, and the end be undone). Asked
-- again once every running copy has re-asserted (the window's end).
local ttl = tonumber(ARGV[11])
if ARGV[12] ~= '' and (went_back(ARGV[12], ttl, KEYS[10]) or recovering(ttl)) then
  return {'retry'}
end
-- A job that leaves the pool leaves a tombstone token, above every run of
-- the key issued before the end (as a stop does): a run a cleanup moved it
-- to on writes a rollback took back, cut off past the recovery window,
-- cannot take the job back when it re-asserts.
-- The tombstone is above this run's token even when the counter and the
-- server clock are not (the clock stepped back since the run's token was
-- issued, a rollback took the counter back).
local above = run + 1
-- The run's end ends its dispatch alone: a newer dispatch a worker holds
-- under an older token, its admission lost with Redis's data, goes on
-- (`note_dispatch_end`). Its payload goes after the tombstone is issued.
if ARGV[7] == 'finished' then
  local _, tombstone = next_token(key, above)
  mdel(JOBS, key)
  end_stored_dispatch(key)
  redis.call('HDEL', KEYS[9], key)
  return {'finished', tombstone}
end
local n = 1
local prev = redis.call('HGET', KEYS[9], key)
local delays = {}
for d in string.gmatch(ARGV[10], '%d+') do
  delays[#delays + 1] = tonumber(d)
end
-- This run's failure counted already (the same call again): a run fails
-- once, and its restart runs under a new token.
local counted, failed_run = string.match(prev or '', '^restarting (%d+) (%d+) ')
if failed_run == ARGV[6] and delays[tonumber(counted)] then
  return {'restarting', tonumber(counted), delays[tonumber(counted)]}
end
if prev and ARGV[9] == 'chain' then
  local state, count, token = string.match(prev, '^(%a+) (%d+) (%d+) ')
  -- The count goes on only for the run the last restart started.
  if (state == 'restarting' or state == 'running') and token == ARGV[6] then
    n = tonumber(count) + 1
  end
end
if n > #delays then
  local _, tombstone = next_token(key, above)
  mdel(JOBS, key)
  end_stored_dispatch(key)
  redis.call('HSET', KEYS[9], key,
    string.format('failed %d %s %d %s', n, ARGV[6], now_ms(), ARGV[8]))
  return {'failed', n, tombstone}
end
redis.call('HSET', KEYS[9], key,
  string.format('restarting %d %s %d %s', n, ARGV[6], now_ms() + delays[n], ARGV[8]))
return {'restarting', n, delays[n]}
