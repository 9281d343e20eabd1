-- Records a start the handler already made, for a start entry the worker
-- knew to be fresh (see `freshness.rs`: read since the worker's lease last
-- held without a gap, and well within its pending guard's deadline, so no
-- cleaner can have moved it and no other admission of the key can exist):
-- ownership with the entry's token, pending guard cleared, entry removed,
-- dispatcher answered. Entries that may be stale take the claim path
-- instead (claim_start.lua before the handler, started.lua after).
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none), 9 worker ttl ms
-- Returns 'ok' | 'superseded' (the caller stops its run) | 'recovering'
-- (Redis lost its data meanwhile: the caller keeps the run, which it
-- re-asserts once registered again) | 'unregistered' (being cleaned up:
-- the caller stops its run, the entry stays for the cleaner).
local key, token, worker, id = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local request = ARGV[8]
local mine = worker .. ' ' .. token
local running = mget(JOBS, key)
local p = mget(PENDING, key)
local status
if running == mine then
  status = 'ok' -- a retry after a lost reply
elseif (not running) and (not p) and recovering(tonumber(ARGV[9])) then
  -- The guard vanished with Redis's data; nothing is admitted while the
  -- pool recovers, so the run here is the only one.
  if redis.call('HEXISTS', WORKERS[1], worker) == 0 then
    return 'recovering'
  end
  mset(JOBS, key, mine)
  status = 'ok'
elseif redis.call('HEXISTS', WORKERS[1], worker) == 0 then
  return 'unregistered'
elseif running or (not p) or string.sub(p, 1, #token + 1) ~= token .. ' ' then
  status = 'superseded'
else
  mdel(PENDING, key)
  mset(JOBS, key, mine)
  status = 'ok'
end
stream_remove(KEYS[9], id)
if request ~= '0' then
  stream_add(KEYS[10], 'reply', request .. ' ' .. status, 1000)
end
return status
