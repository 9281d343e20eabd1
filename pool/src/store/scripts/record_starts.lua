-- Records starts the handlers already made, for start entries their
-- workers knew to be fresh (see `freshness.rs`: read since the worker's
-- lease last held without a gap, and well within the pending guard's
-- deadline, so no cleaner can have moved them and no other admission of the
-- key can exist): ownership with the entry's token, pending guard cleared,
-- entry removed, dispatcher answered. Entries that may be stale take the
-- claim path instead (claim_start.lua before the handler, started.lua
-- after). One call records every start the node's workers queued while
-- its previous calls were in flight (see `recorder.rs`); starts are taken
-- in order, as if each had its own call.
-- KEYS: base, 9 keep-alive revision (`went_back`), 10.. the streams the
--       starts name (worker inboxes, reply streams)
-- ARGV: base, 4 worker ttl ms, 5 the revisions the node has seen (see
--       `went_back`), then 8 per start: job key, token, worker id,
--       inbox entry id, index in KEYS of the worker's inbox, reply request
--       id ('0': none), index in KEYS of the reply stream ('0': none),
--       admission stamp of the start's dispatch (see `stamp_us`; '0':
--       unknown)
-- Returns one status per start: 'ok' | 'superseded' (the caller stops its
-- run) | 'recovering' (Redis lost its data or went back in time meanwhile:
-- the caller keeps the run, which it re-asserts) | 'unregistered' (being
-- cleaned up: the caller stops its run, the entry stays for the cleaner).
-- Answers go out as one 'replies' entry per reply stream, one
-- "<request> <status>" line per start; the dispatcher of an 'ok' start
-- whose admission and payload Redis lost (or went back to an older
-- dispatch's) is answered 'recovering'.
local ttl = tonumber(ARGV[4])
-- Redis went back in time: starts it lost are re-asserted, not dropped.
-- Looked at (INFO server and two revisions, a few µs) only for a start
-- that is not the plain case below, whose answer does not depend on it;
-- every admission looks for itself.
local looked_back = false
local function look_back()
  if not looked_back then
    looked_back = true
    went_back(ARGV[5], ttl, KEYS[9])
  end
end
local registered = {}
local function is_registered(worker)
  if registered[worker] == nil then
    registered[worker] = redis.call('HEXISTS', WORKERS[1], worker) == 1
  end
  return registered[worker]
end
-- One revision and one message per map for the whole call.
local jobs = rmap_batch(JOBS[1], JOBS[2], JOBS[3])
local pending = rmap_batch(PENDING[1], PENDING[2], PENDING[3])
-- A start changes both maps: whether anyone listens, asked once for both.
rmap_batch_listen(jobs, pending)
-- The status of a start that is not the plain case.
local function settle(key, token, worker, mine, p, own_guard, admitted)
  local running = mget(JOBS, key)
  if running or not own_guard then look_back() end
  if running == mine then
    return 'ok' -- a retry after a lost reply
  elseif (not running) and (not p) and recovering(ttl)
      and (tonumber(redis.call('HGET', FENCING, key) or '0') or 0) > tonumber(token) then
    -- No record or guard, but a newer token was issued since this start: a
    -- stop of a newer run made to stand again after the rollback, or a
    -- newer run given back as an orphan. The run here is superseded, as a
    -- re-assertion of it would be (chaos soak seed 1439: a start resent on
    -- a reconnect was recorded over a stop that stood, and resumed).
    return 'superseded'
  elseif (not running) and (not p) and recovering(ttl) then
    -- The guard vanished with Redis's data; nothing is admitted while the
    -- pool recovers, so the run here is the only one. Unless its payload
    -- survived, that run's worker holds the job's only copy until it
    -- re-asserts it: the dispatcher is told 'recovering' (it admits again
    -- once the pool has recovered), not promised a job this process's
    -- death would lose.
    if is_registered(worker) then
      -- A payload of an older dispatch is the state Redis went back to
      -- (that dispatch ended before this one was admitted): under this
      -- run's record it would pass for this run's, and a stop of the
      -- older dispatch made to stand again would stop this run, which a
      -- later admission then runs again (chaos soak seed 1564: job-4365).
      local stored = redis.call('HGET', PAYLOADS, key)
      if stored and payload_admitted(stored) < stamp_us(admitted) then
        redis.call('HDEL', PAYLOADS, key)
        stored = nil
      end
      rmap_batch_set(jobs, key, mine)
      if not stored then
        return 'ok', 'recovering'
      end
      return 'ok'
    end
    return 'recovering'
  elseif running and recovering(ttl)
      and (tonumber(string.match(running, ' (%d+)$') or '') or 0) < tonumber(token) then
    -- A record older than this start: Redis went back in time and lost the
    -- hand-off or restart that led here. Keep the run; the worker's
    -- re-assertion settles it (the newer token wins).
    return 'recovering'
  elseif p and (not running) and recovering(ttl)
      and (tonumber(string.match(p, '^(%d+) ') or '') or 0) < tonumber(token) then
    -- The same for a guard older than this start: the state Redis went
    -- back to held an older admission of the key, not started then. Its
    -- entry is not claimed while the pool recovers (`claim_start.lua`);
    -- the re-assertion of this run takes the guard. Answering
    -- 'superseded' stopped this run, and the older one started after.
    return 'recovering'
  elseif not is_registered(worker) then
    return 'unregistered'
  elseif running or not own_guard then
    return 'superseded'
  end
  rmap_batch_del(pending, key)
  rmap_batch_set(jobs, key, mine)
  return 'ok'
end
local removed = {}
local answers = {}
local statuses = {}
for i = 6, #ARGV, 8 do
  -- The KEYS indices of the inbox and the reply stream stay strings here
  -- (table keys); each is read as a number once, at the end.
  local key, token, worker, id = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local inbox, request, reply = ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
  local mine = worker .. ' ' .. token
  local p = mget(PENDING, key)
  local own_guard = p and string.sub(p, 1, #token + 1) == token .. ' '
  local status, answer
  -- The plain case (no record, this start's own guard, a registered
  -- worker) is settled by one HSETNX of the record; anything else reads
  -- the record and takes the cases of `settle`.
  if own_guard and is_registered(worker) and rmap_batch_set_nx(jobs, key, mine) == 1 then
    rmap_batch_del(pending, key)
    status = 'ok'
  else
    status, answer = settle(key, token, worker, mine, p, own_guard, tonumber(ARGV[i + 7]) or 0)
  end
  if status == 'ok' or status == 'superseded' then
    removed[inbox] = removed[inbox] or {}
    table.insert(removed[inbox], id)
    if request ~= '0' then
      answers[reply] = answers[reply] or {}
      table.insert(answers[reply], request .. ' ' .. (answer or status))
    end
  end
  statuses[#statuses + 1] = status
end
rmap_batch_flush(pending)
rmap_batch_flush(jobs)
for inbox, ids in pairs(removed) do
  redis.call('XDEL', KEYS[tonumber(inbox)], unpack(ids))
end
for reply, lines in pairs(answers) do
  stream_add(KEYS[tonumber(reply)], 'replies', table.concat(lines, '\n'), '1000')
end
return statuses
