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
--       `went_back`), then 10 per admission: job key, body (msgpack
--       job body), owner worker id, reply request id, and the KEYS indices
--       of the owner's inbox and the key's marker, the idempotency window
--       ms (0: none), the schedule leader token (0: not a schedule's
--       dispatch), and the KEYS indices of the schedule's job set and lock
-- Returns, per admission: {'ok', token} | {'exists'} | {'recovering'}
--       | {'recent', ms left} | {'not_leader'} | {'no_worker'} (the owner is
--       gone, being cleaned up or drained) | {'full', len}.
-- The pending guard is "<token> <deadline_ms> <node>/<request>", which makes
-- a retry of the same admission (lost reply) answer 'ok' again.
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

local function admit(key, body, owner, request, inbox, marker, window, leader, record, lock)
  local mine = ' ' .. node .. '/' .. request
  local guard = mget(PENDING, key)
  if guard and string.sub(guard, -#mine) == mine then
    -- A retry of this very admission after a lost reply.
    return {'ok', tonumber(string.match(guard, '^(%d+) '))}
  end
  if recovering_now == nil then
    recovering_now = recovering(ttl)
  end
  if recovering_now then
    -- Records may be stale while the pool recovers (Redis went back in
    -- time: a stopped job's record is back, a running job's is gone):
    -- neither 'exists' nor an admission can be trusted until the workers
    -- have re-asserted what they run.
    return {'recovering'}
  end
  if guard or redis.call('HEXISTS', JOBS[1], key) == 1 then
    return {'exists'}
  end
  local now = now_ms()
  if window > 0 then
    local marked = redis.call('GET', marker)
    local at = marked and tonumber(string.match(marked, '^(%d+)'))
    if at and now - at < window then
      return {'recent', window - (now - at)}
    end
  end
  if leader ~= '0' and redis.call('HGET', lock, 'token') ~= leader then
    return {'not_leader'}
  end
  if not worker_live(owner) then
    return {'no_worker'}
  end
  if max > 0 then
    local len = redis.call('XLEN', inbox)
    if len >= max then return {'full', len} end
  end
  local token = next_token(key)
  rmap_batch_set(pending, key, string.format('%d %d', token, now + pending_ttl) .. mine)
  redis.call('HSET', PAYLOADS, key, string.format('%d ', now) .. body)
  if window > 0 then
    redis.call('SET', marker, string.format('%d %d', now, token), 'PX', window)
  end
  if leader ~= '0' then
    redis.call('HSET', record, key, string.format('%d', token))
  end
  stream_add(inbox, 'start', start_header(token, now, 0, tonumber(request), node) .. body, maxlen)
  return {'ok', token}
end

local replies = {}
for i = 10, #ARGV, 10 do
  replies[#replies + 1] = admit(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    KEYS[tonumber(ARGV[i + 4])], KEYS[tonumber(ARGV[i + 5])], tonumber(ARGV[i + 6]),
    ARGV[i + 7], KEYS[tonumber(ARGV[i + 8])], KEYS[tonumber(ARGV[i + 9])])
end
rmap_batch_flush(pending)
return replies
