-- Admits new jobs and enqueues each start at its owner, atomically (I3).
-- One call admits every dispatch the node queued while its previous calls
-- were in flight (see `admission.rs`); admissions are taken in order, as if
-- each had its own call (two of one key: the second finds the first).
-- KEYS: base, 9 cleanup hash, 10 keep-alive revision (`went_back`),
--       11.. the keys the admissions name: owner
--       inbox streams, idempotency markers (string, PX = window), schedule
--       job sets (hash) and schedule leader-lease locks (hash)
-- ARGV: base, 4 node id, 5 max queued (0: no limit), 6 pending ttl ms,
--       7 inbox maxlen (0: none), 8 worker ttl ms (the recovery window
--       after a data loss), 9 the revisions the node has seen (see
--       `went_back`), then 10 per admission 6: job key, body (msgpack
--       job body), owner worker id, reply request id, the KEYS index of
--       the owner's inbox, and options: empty for a plain dispatch, else
--       "<marker> <window ms> <leader token> <job set> <lock> <started>"
--       (the KEYS indices of the key's idempotency marker, the schedule's
--       job set and its lock; window 0: none; leader token 0: not a
--       schedule's dispatch; started: the token of the run an earlier
--       admission of this same dispatch started, 0: none, see below)
-- Returns, per admission: the token (admitted, or a retry of that very
--       admission) | 'pending' (admitted, requeued or handed off and not
--       started yet, or an orphaned payload) | 'exists' (an owner record:
--       started) | 'recovering'
--       | 'recent <ms left>' | 'ended' (the dispatch's own run, started
--       earlier, has ended since)
--       | 'not_leader' | 'no_worker' (the owner is gone, being cleaned up
--       or drained) | 'full <len>'. A token alone, not a table, because
--       every table of a reply costs Redis several lookups to convert.
-- The pending guard is "<token> <deadline_ms> <node>/<request>", which makes
-- a retry of the same admission (lost reply) answer with its token again.
-- The marker is "<admitted_ms> <token>"; with a window, a key admitted less
-- than a window ago is refused even if it has finished since. A schedule's
-- dispatch is admitted only while the lease record still carries the
-- leader's token, and is recorded in the schedule's job set.
local node = ARGV[4]
local max = tonumber(ARGV[5])
local pending_ttl = tonumber(ARGV[6])
local maxlen = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local cleanup = KEYS[9]
-- One revision and one message of the pending map for the whole call.
local pending = rmap_batch(PENDING[1], PENDING[2], PENDING[3])
local live = {}
local function worker_live(worker)
  if live[worker] == nil then
    live[worker] = worker_active(worker, cleanup)
  end
  return live[worker]
end
local recovering_now = nil
if went_back(ARGV[9], ttl, KEYS[10]) then
  recovering_now = true
end

-- Entries queued per inbox: read once, then counted as this call adds
-- them (exact while nothing trims the inbox, i.e. without a maxlen).
local queued = {}
local function queue_length(inbox)
  if maxlen > 0 then
    return redis.call('XLEN', inbox)
  end
  if queued[inbox] == nil then
    queued[inbox] = redis.call('XLEN', inbox)
  end
  return queued[inbox]
end
-- What the records of every admission of this call share, formatted once
-- (on first use: the server time is read only when something is admitted).
local mine_head = ' ' .. node .. '/'
local now, guard_middle
local header_tail = ' ' .. node .. '\n'
local function stamp()
  if not now then
    now = now_ms()
    guard_middle = string.format(' %d', now + pending_ttl) .. mine_head
  end
end

-- Why a new admission is refused (nil: it is not): admitted within its
-- idempotency window, a schedule's lease lost, the owner gone, its inbox
-- full.
local function refusal(owner, inbox, window, leader, marker, lock)
  if window > 0 then
    local marked = redis.call('GET', marker)
    local at = marked and tonumber(string.match(marked, '^(%d+)'))
    if at and now - at < window then
      return string.format('recent %d', window - (now - at))
    end
  end
  if leader ~= '0' and redis.call('HGET', lock, 'token') ~= leader then
    return 'not_leader'
  end
  if not worker_live(owner) then
    return 'no_worker'
  end
  if max > 0 then
    local len = queue_length(inbox)
    if len >= max then return string.format('full %d', len) end
  end
  return nil
end

-- Why a key that is not new is not admitted: a retry of this very
-- admission after a lost reply (its token), the pool recovering, an owner
-- record (`exists`: started), or a guard or payload (`pending`).
-- `recorded`: an owner record was found.
local function not_new(key, request, recorded)
  local guard = mget(PENDING, key)
  if guard then
    local mine = mine_head .. request
    local token = string.sub(guard, -#mine) == mine and tonumber(string.match(guard, '^(%d+) '))
    if token then
      return token
    end
  end
  if recovering_now then
    -- Records may be stale while the pool recovers (Redis went back in
    -- time: a stopped job's record is back, a running job's is gone):
    -- neither 'exists' nor an admission can be trusted until the workers
    -- have re-asserted what they run.
    return 'recovering'
  end
  if recorded then
    -- A record without its payload, once the pool has recovered, is a
    -- start recorded during a recovery whose worker never re-asserted it
    -- (its process died first): not a job that runs. The caller waits;
    -- the cleanup of that worker releases the record.
    if redis.call('HEXISTS', PAYLOADS, key) == 0 then
      return 'pending'
    end
    return 'exists'
  end
  -- Admitted, requeued or handed off but not started yet (a guard), or an
  -- orphan (a payload alone: a job still owed a run, which the sweep
  -- requeues; e.g. a dispatch whose start never came, its guard swept).
  -- Redis may still lose it before any worker holds it (an empty restart,
  -- a rollback), and nobody would run it again: the caller waits for its
  -- start rather than answer 'exists' for a job that may never run.
  return 'pending'
end

-- A key is new when the pool is not recovering, no owner record names it
-- and one HSETNX stores its payload: every guard is written with its
-- payload (here and when a payload is requeued) and goes before or with
-- it, so a new key has no guard either, and the guard is not read first
-- (a command per dispatch). The guard is still written only where none is
-- (HSETNX): a guard without a payload, were one ever left, is kept, and
-- the key is not admitted.
local function admit(key, body, owner, request, inbox, options)
  local window, leader, marker, record, lock, started = 0, '0', nil, nil, nil, 0
  if options ~= '' then
    local m, w, l, r, k, st = string.match(options, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
    if not m then
      error('malformed admission options: ' .. options)
    end
    window, leader, started = tonumber(w), l, tonumber(st)
    marker, record, lock = KEYS[tonumber(m)], KEYS[tonumber(r)], KEYS[tonumber(k)]
  end
  if recovering_now == nil then
    recovering_now = recovering(ttl)
  end
  if recovering_now then
    return not_new(key, request, false)
  end
  if redis.call('HEXISTS', JOBS[1], key) == 1 then
    return not_new(key, request, true)
  end
  stamp()
  -- The admission's token is the payload's admission stamp ("<token>
  -- <body>"), which every requeue, hand-off and move of this dispatch
  -- keeps: unlike a time, it tells this dispatch from any other of the key
  -- (a stop that must stand again reaches this one, not the next).
  local token, text = token_after(key)
  -- The payload first: one HSETNX both stores it and finds a guard's or
  -- an orphan's (a refusal below takes it back).
  if redis.call('HSETNX', PAYLOADS, key, text .. ' ' .. body) == 0 then
    return not_new(key, request, false)
  end
  -- An earlier admission of this dispatch started a run, answered
  -- 'recovering' (Redis had lost the admission) and admitted again once
  -- the pool recovered, in case that run's worker died before it
  -- re-asserted the run. A token above the run's means it ended since
  -- (finished, failed for good, stopped: each leaves one) or was moved
  -- on: the job started, and admitting it again would undo its end. A
  -- lost run leaves none (its record is released, the counter kept).
  if started > 0 and (tonumber(redis.call('HGET', FENCING, key) or '0') or 0) > started then
    redis.call('HDEL', PAYLOADS, key)
    return 'ended'
  end
  local refused = refusal(owner, inbox, window, leader, marker, lock)
  if refused then
    redis.call('HDEL', PAYLOADS, key)
    return refused
  end
  if rmap_batch_set_nx(pending, key, text .. guard_middle .. request) == 0 then
    redis.call('HDEL', PAYLOADS, key)
    return not_new(key, request, false)
  end
  keep_token(key, text)
  if window > 0 then
    redis.call('SET', marker, string.format('%d %d', now, token), 'PX', window)
  end
  if leader ~= '0' then
    redis.call('HSET', record, key, text)
  end
  -- The start entry: start_header(token, token, 0, request, node) .. body.
  stream_add(inbox, 'start', text .. ' ' .. text .. ' 0 ' .. request .. header_tail .. body, maxlen)
  if queued[inbox] then
    queued[inbox] = queued[inbox] + 1
  end
  return token
end

local replies = {}
for i = 10, #ARGV, 6 do
  replies[#replies + 1] = admit(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    KEYS[tonumber(ARGV[i + 4])], ARGV[i + 5])
end
rmap_batch_flush(pending)
return replies
