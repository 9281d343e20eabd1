-- Claims a job for a worker *before* its handler starts it, so that no two
-- workers ever run one key (I1): a start is only attempted by the worker
-- whose claim Redis accepted. Ownership is recorded with the entry's
-- fencing token and the pending guard cleared. The inbox entry stays until
-- the start is confirmed (started.lua) or refused (start_failed.lua), so a
-- claim whose reply was lost is simply claimed again.
-- KEYS: base, 9 worker inbox, 10 reply stream (any pool key when no reply),
--       11 cleanup hash, 12 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 token, 6 worker id, 7 inbox entry id,
--       8 reply request id (0: none), 9 worker ttl ms (the recovery
--       window), 10 the revisions the node has seen (`went_back`),
--       11 pending ttl ms (the guard deadline of an entry issued again)
-- Returns 'ok' | 'superseded' (entry removed, dispatcher answered; also
-- for a start of a dispatch marked over, which ends) |
-- 'unregistered' (the worker is gone or being cleaned up: the entry stays
-- for the cleaner to move) | 'gone' (the entry is no longer in this
-- worker's inbox: a cleaner moved it, and the copy it appended elsewhere,
-- which may already be starting there, is the live one) | 'recovering'
-- (Redis lost data or went back in time and the pool recovers: the entry
-- stays, to be claimed once every running copy has re-asserted) |
-- 'reissued' (the entry was issued before the pool's last recovery began:
-- it is replaced by one with a newer token, appended to the same inbox,
-- which the worker claims in turn).
local key, token, worker = ARGV[4], ARGV[5], ARGV[6]
if redis.call('HEXISTS', WORKERS[1], worker) == 0 or redis.call('HEXISTS', KEYS[11], worker) == 1 then
  return 'unregistered'
end
local entry = redis.call('XRANGE', KEYS[9], ARGV[7], ARGV[7])[1]
if not entry then
  return 'gone'
end
local mine = worker .. ' ' .. token
local running = mget(JOBS, key)
if running == mine then
  -- Claimed already: a retry after a lost reply.
  return 'ok'
end
local p = mget(PENDING, key)
-- No guard at all: the stale-pending sweep removed it, the entry having
-- waited in the worker's backlog past its deadline, and the job is an
-- orphan until the orphan sweep requeues it with a newer token. Until
-- then this entry is still the key's newest start (the key's counter is
-- its token: no admission, move, requeue or end came since) and the job
-- is still wanted (its payload is there): claimed as if guarded. Refused,
-- each requeue could wait out its deadline in the same backlog (chaos
-- soak seed 1449: three requeues in 33 s, the job running nowhere until
-- an empty restart took its only copy).
local function lapsed_but_newest()
  return tonumber(redis.call('HGET', FENCING, key) or '') == tonumber(token)
    and redis.call('HEXISTS', PAYLOADS, key) == 1
end
-- The entry goes and its dispatcher is told.
local function superseded()
  stream_remove(KEYS[9], ARGV[7])
  if ARGV[8] ~= '0' then
    stream_add(KEYS[10], 'reply', ARGV[8] .. ' superseded', 1000)
  end
  return 'superseded'
end
local guarded = p and string.sub(p, 1, #token + 1) == token .. ' '
if running or not (guarded or (not p and lapsed_but_newest())) then
  return superseded()
end
-- A start of a dispatch marked over (a stop or end made to stand again after a
-- rollback found a newer run of it, see `dispatch_over`): the dispatch
-- ends here, before any run of it starts. Fresh starts do not come here
-- (`record_starts.lua`), and a start that follows a rollback is not fresh.
local stored = redis.call('HGET', FENCING, ENDED .. key)
  and redis.call('HGET', PAYLOADS, key)
if stored and dispatch_over(key, stored) then
  end_dispatch_over(key)
  return superseded()
end
-- While the pool recovers, the entry may be one Redis brought back by
-- going back in time, of a key that runs on another worker with a newer
-- token Redis lost and that worker has not re-asserted yet: a claim now
-- would run the key twice (chaos soak seed 1432: a hand-off's start entry,
-- back with the rollback, claimed by its new owner, cut off until then,
-- while the worker it had gone back to ran it). Nothing is admitted then
-- either; a retry of a claim that went through is answered above.
local ttl = tonumber(ARGV[9])
if went_back(ARGV[10], ttl, KEYS[12]) or recovering(ttl) then
  return 'recovering'
end
-- An entry issued before the pool's last recovery began may be one Redis
-- brought back by going back in time, of a key that still runs on a worker
-- with a newer token Redis lost, out of reach (paused, cut off) through the
-- whole window. Claimed under its old token, this run would rank below that
-- copy, and fencing would favour the stale one (chaos soak seed 1439:
-- job-0908). It is issued again instead, with a token newer than any issued
-- before the recovery (tokens follow server time), and a fresh guard
-- deadline; the worker claims the new entry as any other. One hop more: a
-- moved entry is claimed before its start, never started as fresh.
local epoch = control_field(C_EPOCH)
local recovered_us = (epoch and tonumber(string.match(epoch, '^(%d+) ') or '0') or 0) * 1000
if tonumber(token) < recovered_us then
  local fields, body = entry[2]
  local topic
  for i = 1, #fields, 2 do
    if fields[i] == 'p' then body = fields[i + 1] elseif fields[i] == 't' then topic = fields[i + 1] end
  end
  -- "<token> <admitted> <hops> <request> <node>\n<body>"
  local created, hops, rest = string.match(body or '', '^%d+ (%d+) (%d+) (.*)$')
  if created then
    local _, text = next_token(key, recovered_us)
    local deadline = now_ms() + tonumber(ARGV[11])
    local due, guard_rest = string.match(string.sub(p or '', #token + 2), '^(%d+)(.*)$')
    if due and tonumber(due) > deadline then deadline = tonumber(due) end
    mset(PENDING, key, string.format('%s %d', text, deadline) .. (guard_rest or ''))
    stream_remove(KEYS[9], ARGV[7])
    stream_add(KEYS[9], 'start', string.format('%s %s %d ', text, created,
      math.min(tonumber(hops) + 1, 255)) .. rest, 0, topic)
    return 'reissued'
  end
end
mdel(PENDING, key)
mset(JOBS, key, mine)
return 'ok'
