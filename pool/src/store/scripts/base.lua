-- Shared head of every pool function (after the rmap and streaming
-- preludes), run once when Redis loads the pool's function library (see
-- `registry.rs`): the helpers below are made once, not at every call.
-- KEYS[1..8]: jobs hash, jobs revision, pending hash, pending revision,
--             workers hash, workers revision, payloads hash, fencing hash
-- ARGV[1..3]: jobs channel, pending channel, workers channel
-- Function-specific KEYS start at 9 and ARGV at 4.

-- The state of one call. Redis runs one function at a time, so these
-- library-level variables serve each call as its own locals would;
-- `pool_call_begin` sets every one of them before a function's body runs.
local KEYS, ARGV
local JOBS, PENDING, WORKERS, PAYLOADS, FENCING
-- Redis server time, read once per call (a function is atomic, so one
-- reading serves all its uses and saves a TIME call per use).
local server_time_us
-- The pool's control fields of the fencing hash as this call found them
-- (see `control_field` below).
local control

-- Starts a call: its keys and arguments, the maps they name, and the
-- per-call state of the preludes (no replica revision floor, an empty
-- cache of formatted lengths), as a script run afresh would have them.
local function pool_call_begin(keys, args)
  KEYS, ARGV = keys, args
  JOBS = {keys[1], keys[2], args[1]}
  PENDING = {keys[3], keys[4], args[2]}
  WORKERS = {keys[5], keys[6], args[3]}
  PAYLOADS = keys[7]
  FENCING = keys[8]
  server_time_us = nil
  control = nil
  rmap_begin()
end

local function mset(m, f, v) return rmap_set(m[1], m[2], m[3], f, v) end
local function mdel(m, f) return rmap_del(m[1], m[2], m[3], f) end
local function mget(m, f) return redis.call('HGET', m[1], f) end

local function now_us()
  if not server_time_us then
    local t = redis.call('TIME')
    server_time_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_time_us
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

-- The pool's epoch: a field of the fencing hash that no job key can be (job
-- keys have no control characters), "<since_ms> <recovering_until_ms>".
-- Node::join creates it; when Redis loses its data it vanishes with the rest.
local EPOCH = '\nepoch'

-- The nodes still reconciling their workers after Redis lost data or went
-- back in time: another field of the fencing hash, "<node> <until_ms> …".
-- Each node marks itself before its workers re-register and re-assert what
-- they run, renews its mark while they do, and clears it when done; the
-- recovery window lasts until its own end *and* until no mark is live, so
-- it ends when the pool has re-converged, not after a fixed time (a mark
-- of a node that died lapses within a TTL).
local RECOVERY_MARKS = '\nrecovering'

-- The run id of the server the pool's scripts last ran on: another field
-- of the fencing hash. A restart or failover brings a server with a new
-- run id while this field holds an older one (written before the snapshot
-- it restarted from, or replicated from the old primary), so the first
-- script on the new server sees the change whichever node calls it, even a
-- node that joined after the restart and knows no other server.
local SERVER = '\nserver'

-- When Redis last served a keep-alive, and when it came back to serving
-- after serving none for half a TTL: another field of the fencing hash,
-- "<last_ms> <resumed_ms>" (`note_pulse`, `serving_since`). While Redis
-- serves nobody (frozen, restarting, its clock stepped forward, every node
-- cut off) no worker can renew, so a worker's silence counts from the
-- later of its last renewal and that return: judged by `TIME` alone, a
-- stall of a TTL made every live worker look dead at once (chaos soak seed
-- 1652: ten workers cleaned up on Redis waking from a 1.75 s freeze).
local PULSE = '\npulse'

-- The three control fields, read with one HMGET on first use in a call
-- (an admission needs all three: three HGETs were two calls too many) and
-- kept current by the helpers below that write them. A script that writes
-- one itself (recovery_mark.lua) reads it itself too. (The pulse is read
-- apart: only keep-alives and judgements of death need it.)
local C_SERVER, C_EPOCH, C_MARKS = 1, 2, 3

-- The pools (by fencing hash) whose epoch a script found on this server.
-- Library state lives as long as the server process, and a FLUSHALL keeps
-- it: a pool listed here whose epoch is gone lost its data on this very
-- server, whereas a pool with no epoch and not listed may be new
-- (`create_epoch.lua`).
local epoch_held = {}

local function control_field(i)
  if not control then
    control = redis.call('HMGET', FENCING, SERVER, EPOCH, RECOVERY_MARKS)
    if control[C_EPOCH] then epoch_held[FENCING] = true end
  end
  return control[i]
end

local function set_control_field(i, field, value)
  redis.call('HSET', FENCING, field, value)
  if control then control[i] = value end
  if i == C_EPOCH then epoch_held[FENCING] = true end
end

-- Whether a node's recovery mark is live at `now` (ms).
local function recovery_marked(now)
  local marks = control_field(C_MARKS)
  if not marks then return false end
  for until_ms in string.gmatch(marks, '%S+ (%d+)') do
    if tonumber(until_ms) > now then return true end
  end
  return false
end

-- Whether the pool is recovering from a loss of its Redis data. The first
-- script that finds the epoch gone opens a recovery window of `ttl` ms:
-- within it every live worker renews, registers again and re-asserts the
-- jobs it runs, and nothing new is admitted (a key still running on a
-- worker that has not re-asserted yet would otherwise start twice).
local function recovering(ttl)
  local now = now_ms()
  local epoch = control_field(C_EPOCH)
  if not epoch then
    set_control_field(C_EPOCH, EPOCH, string.format('%d %d', now, now + ttl))
    return true
  end
  local until_ms = tonumber(string.match(epoch, ' (%d+)$') or '0') or 0
  return now < until_ms or recovery_marked(now)
end

-- Opens the recovery window for `ttl` ms from now, unless one is open.
-- Returns whether it opened one.
local function open_recovery_window(ttl)
  local now = now_ms()
  local epoch = control_field(C_EPOCH)
  local until_ms = epoch and tonumber(string.match(epoch, ' (%d+)$') or '0') or 0
  if now < until_ms then return false end
  set_control_field(C_EPOCH, EPOCH, string.format('%d %d', now, now + ttl))
  return true
end

-- The run id of the server this library runs in, read from INFO once.
-- A run id belongs to a server process, and so does this library's state:
-- a restart, or another server taking over, starts with the library loaded
-- afresh and this unset. INFO formats its whole section at every call
-- (6-10 µs, more than any command an admission runs). A replica keeps its
-- run id when it is promoted, so what it cached is still its own.
local this_server_run_id

local function server_run_id()
  if this_server_run_id == nil then
    -- A plain find, then a match anchored there: an unanchored pattern
    -- would be tried at every byte of the section before it.
    local info = redis.call('INFO', 'server')
    local at = string.find(info, 'run_id:', 1, true)
    this_server_run_id = at and string.match(info, '^%w+', at + 7) or false
  end
  return this_server_run_id or nil
end

-- This server's run id (nil when INFO shows none), and whether the pool's
-- scripts last ran on another server: it then records this one, so only
-- the first script after a change sees it. A missing record is not a sign
-- (an empty restart loses it with the epoch, whose absence opens the
-- window).
local function server_changed()
  local run_id = server_run_id()
  if not run_id then return nil, false end
  local last = control_field(C_SERVER)
  if last == run_id then return run_id, false end
  set_control_field(C_SERVER, SERVER, run_id)
  return run_id, last ~= false
end

-- Whether Redis is behind what the caller has seen: Redis went back in
-- time (a restart from an older snapshot, a replica promoted with lost
-- writes) and may have lost starts of keys that still run. Opens the
-- recovery window then, at once, rather than wait for a replica to notice.
-- `seen` is "<jobs> <keep-alives> <run id>": the highest revisions of the
-- jobs map (0: the caller does not mirror it) and of the keep-alive map the
-- caller has applied, and the run id of the server it last checked ('-':
-- not known); `keepalive_rev` is the
-- keep-alive map's revision key. The keep-alive map changes with every
-- renewal of every node, so a caller that does not mirror the jobs still
-- sees a loss of any stretch of writes that holds a renewal; the server's
-- run id catches a restart or failover that lost writes no revision shows
-- (a dispatch made just before it, by another node), before the caller's
-- own check after its reconnect: against the server the caller knows, and
-- against the one the pool's scripts last ran on (`SERVER`), which a node
-- that joined after the restart cannot know otherwise. The run id, not
-- LASTSAVE: LASTSAVE stays the same across a restart within the second of
-- the last save, which let a key lost that way be admitted again while it
-- still ran.
-- A missing revision is not a sign: after an empty restart the epoch's
-- absence opens the window, and a revision only comes back with the next
-- change of its map (there may be none while nothing runs).
local function went_back(seen, ttl, keepalive_rev)
  local jobs_seen, keepalive_seen, run_id_seen =
    string.match(seen or '', '^(%d+) (%d+) (%S+)$')
  local function behind(revision_key, highest)
    highest = tonumber(highest) or 0
    if highest == 0 then return false end
    local rev = tonumber(redis.call('GET', revision_key) or '')
    return rev ~= nil and rev < highest
  end
  -- Always checked first, so the record of the server is kept current
  -- whatever else shows the loss.
  local function restarted()
    if run_id_seen == nil or run_id_seen == '-' then return false end
    local run_id, changed = server_changed()
    return changed or (run_id ~= nil and run_id ~= run_id_seen)
  end
  if not (restarted() or behind(JOBS[2], jobs_seen)
      or behind(keepalive_rev, keepalive_seen)) then
    return false
  end
  open_recovery_window(ttl)
  return true
end

-- The next fencing token of `key`: max(last token + 1, Redis server time
-- in µs). Tokens keep increasing when Redis loses the counters (empty
-- restart) and when it goes back in time (a rollback restores older
-- counters, but server time has moved past every token issued since).
-- Returns the token and its decimal text (formatted once for every record
-- that carries it). `token_after` only reads: the caller that goes on to
-- use the token records it with `keep_token`. `floor` (optional) is a
-- least value: a token outranking every one issued before it.
local function token_after(key, floor)
  local last = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
  local token = math.max(last + 1, now_us(), floor or 0)
  return token, string.format('%d', token)
end

local function keep_token(key, text)
  redis.call('HSET', FENCING, key, text)
end

local function next_token(key, floor)
  local token, text = token_after(key, floor)
  keep_token(key, text)
  return token, text
end

-- Whether `worker` may be given jobs: registered, not being cleaned up
-- (`cleanup`: the cleanup hash) and not drained. A drained worker's record
-- carries "drained_at_ms" (see drain_worker.lua); records are written by
-- cjson alone (no spaces), and a host or node name holding that text is
-- escaped (\"), so a plain find cannot match anything but the field.
local function worker_active(worker, cleanup)
  local record = mget(WORKERS, worker)
  if not record or redis.call('HEXISTS', cleanup, worker) == 1 then
    return false
  end
  return not string.find(record, '"drained_at_ms":', 1, true)
end

-- When registered `worker` (`registration`: its record) last renewed, on
-- server time (ms): its keep-alive in `keepalive`, or, if it never
-- renewed, its registration time.
local function last_renewal(worker, registration, keepalive)
  local last = tonumber(redis.call('HGET', keepalive, worker) or '')
  if last then return last end
  local ok, info = pcall(cjson.decode, registration)
  return (ok and type(info) == 'table' and tonumber(info['created_at_ms'])) or 0
end

-- Since when Redis has served keep-alives without a gap of half of `ttl`
-- (ms, server time): now, when the last one served is older than that
-- (Redis just came back, and no keep-alive has been served since). No
-- pulse at all (a pool of an older build, or none renewed yet): 0, and
-- silence is judged by `TIME` alone as before.
local function serving_since(ttl)
  local pulse = redis.call('HGET', FENCING, PULSE)
  if not pulse then return 0 end
  local last, resumed = string.match(pulse, '^(%d+) (%d+)$')
  local now = now_ms()
  last = tonumber(last or '0') or 0
  if now - last > ttl / 2 then return now end
  return tonumber(resumed or '0') or 0
end

-- Records a keep-alive served now (`keepalive.lua`): the pulse that
-- `serving_since` reads. The first one knows of no stall (0): a new pool,
-- or one whose data Redis lost, which the recovery window covers.
local function note_pulse(ttl)
  redis.call('HSET', FENCING, PULSE, string.format('%d %d', now_ms(), serving_since(ttl)))
end

-- When `worker`'s silence began, on server time (ms): its last renewal
-- (see `last_renewal`), or Redis's return to serving if that is later.
-- For judging a worker dead only (a cleanup's claim, a stop carried out on
-- a dead worker's behalf): whether a worker may be given work is judged
-- on its renewals alone, as before: a worker that died during the stall
-- (or whose death a rollback to an older pulse hides) would otherwise be
-- handed jobs, and a leaving worker's memory, for a TTL after it.
local function silent_since(worker, registration, keepalive, ttl)
  return math.max(last_renewal(worker, registration, keepalive), serving_since(ttl))
end

-- Whether `worker` will read its inbox soon: active (see above), and its
-- last keep-alive (or, if never renewed, its registration) within `ttl`
-- ms on server time (`keepalive`: the keep-alive hash). A worker whose
-- process died stays registered until a cleanup, which no node may run
-- (a pool of client-only nodes, every worker gone).
-- The second result tells an active worker silent for over the TTL (dead:
-- it will not come back) from one not active (which may be back soon, e.g.
-- registered again after a loss).
local function worker_reading(worker, cleanup, keepalive, ttl)
  if not worker_active(worker, cleanup) then return false, false end
  if now_ms() - last_renewal(worker, mget(WORKERS, worker), keepalive) <= ttl then
    return true, false
  end
  return false, true
end

-- Whether a job may be moved to `worker` (a hand-off, a requeue): it
-- reads its inbox (see `worker_reading`) and has renewed or registered
-- since the pool last found its data lost or gone back in time (the
-- epoch's first field). A rollback brings back the registration and the
-- last renewal of a worker whose process has left since: it looks alive
-- for up to a TTL, and a job moved to it would start nowhere until a
-- cleanup finds it dead. A live worker renews or registers again within
-- a renewal interval of the loss, and is a target from then on.
-- `floor` (optional): the least server time (ms) the caller's own clock
-- says it can be now. Silence is then judged by the smaller of `TIME` and
-- it, as a cleanup's claim is (`claim_cleanup.lua`): after a forward step
-- of the server's wall clock every keep-alive looks a step old until its
-- worker renews, and a cleanup's hand-offs, refused meanwhile, came a
-- renewal period late (chaos soak seed 1613: a killed process's jobs not
-- moved yet were lost to an empty restart 2.4 s after the kill).
local function worker_current(worker, cleanup, keepalive, ttl, floor)
  if not worker_active(worker, cleanup) then return false end
  local last = last_renewal(worker, mget(WORKERS, worker), keepalive)
  local now = now_ms()
  if floor and floor < now then now = floor end
  if now - last > ttl then return false end
  local epoch = control_field(C_EPOCH)
  local lost_at = epoch and tonumber(string.match(epoch, '^(%d+) ') or '0') or 0
  return last >= lost_at
end

-- The generation of the pool's data: a field of the fencing hash, made
-- here when missing, so it changes only when Redis lost that hash (an
-- empty restart, a FLUSHALL, the pool's keys deleted). With the run id it
-- tells a caller whether Redis may have lost writes between two calls.
local function data_generation()
  local generation = redis.call('HGET', FENCING, '\ngeneration')
  if not generation then
    generation = string.format('%d', now_us())
    redis.call('HSET', FENCING, '\ngeneration', generation)
  end
  return generation
end

-- Whether an admission stamp is the token the admission issued
-- (`admit.lua`, µs), which names one dispatch, rather than the ms of server
-- time that builds before wrote (below 10^14), which may name several.
local function stamp_is_exact(stamp)
  return stamp >= 100000000000000
end

-- An admission stamp in µs: exact ones as they are, ms ones scaled.
local function stamp_us(stamp)
  if stamp_is_exact(stamp) then return stamp end
  return stamp * 1000
end

-- The admission stamp (µs, see `stamp_us`) of a stored payload
-- ("<admitted> <body>"; 0 when unreadable). It is the token the admission
-- issued, so it tells this dispatch from any other of the key, and a run
-- token at or above it was issued at or after this admission.
local function payload_admitted(stored)
  return stamp_us(tonumber(string.match(stored, '^(%d+) ') or '') or 0)
end

-- Whether a run of the dispatch whose payload a worker holds (`stored`)
-- ended on this side of a diverged Redis: the key's fencing counter
-- (`current`) shows a token this side issued at or after the dispatch's
-- admission, and no payload is left (only an end takes it away). A side
-- that never saw the admission issued no token after it. Used by a
-- yielding worker (`reassert.lua`, `handoff_stands.lua`) to tell a run
-- that moved here and ended from an admission this side never had.
local function ended_here(key, current, stored)
  return current ~= nil and current >= payload_admitted(stored)
    and redis.call('HEXISTS', PAYLOADS, key) == 0
end

-- Dispatches over for good whose runs a state Redis went back to may
-- still show: a field of the fencing hash per key ('\nended ' .. key; no
-- job key has a control character) holding a token, every dispatch of the
-- key admitted at or before it being over. `stop_stands.lua` writes it
-- when the end of a whole dispatch (a stop `stop_job` was answered for, a
-- run that finished or failed for good), made to stand again, finds a
-- newer run of that dispatch on that state (a cleanup moved the ended run
-- before the end stood again). The node that asked for a stop stops that
-- run through its worker, but while the pool recovers a dead worker's run
-- waits, and the cleanup after the window moved it to a live worker,
-- which started the ended dispatch again (chaos soak seed 1586). So a
-- cleanup, the orphan sweep, or a claim of a start that is not fresh ends
-- such a dispatch instead of running it.
local ENDED = '\nended '

-- Marks every dispatch of `key` admitted at or before `token` over.
local function mark_dispatch_over(key, token)
  local field = ENDED .. key
  if token > (tonumber(redis.call('HGET', FENCING, field) or '0') or 0) then
    redis.call('HSET', FENCING, field, string.format('%d', token))
  end
end

-- Whether the dispatch of `key` whose payload Redis holds (`stored`) is
-- marked over. A mark older than the payload's admission names no
-- dispatch Redis holds any more, and goes.
local function dispatch_over(key, stored)
  local field = ENDED .. key
  local marked = tonumber(redis.call('HGET', FENCING, field) or '')
  if not marked then return false end
  local admitted = payload_admitted(stored)
  if admitted > marked then
    redis.call('HDEL', FENCING, field)
    return false
  end
  return stamp_is_exact(admitted)
end

-- Every end of a dispatch raises the key's `ENDED` mark to what it ended
-- (`note_dispatch_end`): a stop of one dispatch, a run that finished, failed
-- for good or was refused, to that dispatch's admission stamp; a stop of
-- the whole key, to its tombstone (every dispatch admitted before the stop
-- is over). Tokens are issued from the clock, so after a rollback a run of
-- an *older* dispatch (moved by a cleanup on the state Redis went back to)
-- and its end's tombstone take tokens above a run of a *newer* dispatch
-- that Redis lost and a worker still holds: "a newer token and no payload"
-- then no longer means the held dispatch ended (chaos soak seed 1645, chaos
-- CI seed 7: the newer dispatch, its only copy held, was given up). The
-- mark tells: a held copy of a dispatch admitted after it was not ended.
local function note_dispatch_end(key, bound)
  if bound and bound > 0 then mark_dispatch_over(key, bound) end
end

-- A newer dispatch that waits for the run of an older one to end: a
-- field of the fencing hash per key ('\nnext ' .. key) holding the newer
-- dispatch's stored payload. A worker that re-asserts a run Redis lost
-- (`reassert.lua`) may find a run of an *older* dispatch recorded over it
-- with a newer token: the state Redis went back to showed that dispatch,
-- ended before the newer one was admitted, and a cleanup moved it on. The
-- older run stops (its dispatch is marked over, and the worker's node
-- stops it through its worker); until it has, its record keeps the key
-- known, and at its end the waiting payload takes the older one's place
-- in the same call, an orphan for the sweep. Given up to the older run
-- and given back a settle round after its end, the newer dispatch was
-- known to no one in between, and admitted again (chaos_short seed 45:
-- `sched-19`).
local WAITING = '\nnext '

-- Keeps `stored` to become `key`'s payload when the older dispatch's run
-- recorded for the key ends (`take_up_waiting`).
local function wait_for_older_end(key, stored)
  local field = WAITING .. key
  local waiting = redis.call('HGET', FENCING, field)
  if not waiting or payload_admitted(waiting) < payload_admitted(stored) then
    redis.call('HSET', FENCING, field, stored)
  end
end

-- Where the payload Redis holds for `key` (beside a record or guard) is of
-- a dispatch admitted before `stored`'s: that dispatch is over (one key
-- admits a dispatch only once the one before has ended), so it is marked
-- over and `stored` waits for its run's end. Returns the older dispatch's
-- admission stamp, or nil.
local function supersede_older(key, stored)
  local held = redis.call('HGET', PAYLOADS, key)
  if not held then return nil end
  local older = payload_admitted(held)
  if older <= 0 or older >= payload_admitted(stored) then return nil end
  mark_dispatch_over(key, older)
  wait_for_older_end(key, stored)
  return older
end

-- Called where an end took `key`'s payload, after the end was noted
-- (`note_dispatch_end`): the newer dispatch waiting for it becomes the
-- payload, unless the end reached it too (a stop of the key: the
-- dispatch-over mark at or above its admission).
local function take_up_waiting(key)
  local field = WAITING .. key
  local waiting = redis.call('HGET', FENCING, field)
  if not waiting or redis.call('HEXISTS', PAYLOADS, key) == 1 then return end
  redis.call('HDEL', FENCING, field)
  local marked = tonumber(redis.call('HGET', FENCING, ENDED .. key) or '') or 0
  if payload_admitted(waiting) > marked then
    redis.call('HSET', PAYLOADS, key, waiting)
  end
end

-- Removes `key`'s payload, its dispatch over (see `note_dispatch_end`).
local function end_stored_dispatch(key)
  local stored = redis.call('HGET', PAYLOADS, key)
  if not stored then return end
  redis.call('HDEL', PAYLOADS, key)
  note_dispatch_end(key, payload_admitted(stored))
  take_up_waiting(key)
end

-- Whether the ends Redis knows of `key` ended only dispatches admitted
-- before `admitted` (µs, an exact stamp; see `note_dispatch_end`). No mark
-- (an end of a build before, or none): not known.
local function only_older_ended(key, admitted)
  if not stamp_is_exact(admitted) then return false end
  local marked = tonumber(redis.call('HGET', FENCING, ENDED .. key) or '')
  return marked ~= nil and marked < admitted
end

-- Ends the dispatch of `key` marked over instead of issuing a run of it:
-- its payload and pending guard go, and the fencing counter rises just
-- above every run issued, so no copy of one re-asserts. Not to a token
-- from the clock: a later dispatch whose admission Redis lost may run on
-- a worker that has not re-asserted it yet, and must still outrank this.
local function end_dispatch_over(key)
  redis.call('HDEL', PAYLOADS, key)
  if mget(PENDING, key) then mdel(PENDING, key) end
  local current = tonumber(redis.call('HGET', FENCING, key) or '0') or 0
  keep_token(key, string.format('%d', current + 1))
  take_up_waiting(key)
end

-- When a cleanup claim ("<node> <since_ms>") was made (0 when unreadable).
local function claim_since(claim)
  return tonumber(string.match(claim, ' (%d+)$') or '0') or 0
end

-- Whether the cleanup claim on `worker` (in hash `cleanup`, "<node>
-- <since_ms>") is held by node `cleaner`; any claim state passes when
-- `cleaner` is '' (not a cleanup: a worker leaving, a rebalance).
local function claim_held(cleanup, worker, cleaner)
  if cleaner == '' then return true end
  local claim = redis.call('HGET', cleanup, worker)
  return claim ~= false and string.sub(claim, 1, #cleaner + 1) == cleaner .. ' '
end

-- "<worker> <token>" → worker
local function owner_of(v)
  if not v then return nil end
  return string.match(v, '^(%S+) ')
end

-- Header of a start entry: "<token> <admitted> <hops> <request> <node>\n"
local function start_header(token, admitted, hops, request, node)
  return string.format('%d %d %d %d %s\n', token, admitted, hops, request, node)
end

-- Issues a new fencing token for `key`, records the pending guard and
-- appends a start entry for the stored payload to `inbox`. With
-- `ends_over` (a cleanup's or the orphan sweep's move) a dispatch marked
-- over is ended instead (`end_dispatch_over`): false, 'ended'.
local function enqueue_stored(key, inbox, pending_ttl, maxlen, ends_over)
  local stored = redis.call('HGET', PAYLOADS, key)
  if not stored then return false end
  if ends_over and dispatch_over(key, stored) then
    end_dispatch_over(key)
    return false, 'ended'
  end
  local sp = string.find(stored, ' ', 1, true)
  local admitted = tonumber(string.sub(stored, 1, sp - 1))
  local body = string.sub(stored, sp + 1)
  local now = now_ms()
  local token = next_token(key)
  mset(PENDING, key, string.format('%d %d', token, now + pending_ttl))
  stream_add(inbox, 'start', start_header(token, admitted, 0, 0, '-') .. body, maxlen)
  return token, stored
end
