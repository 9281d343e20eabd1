-- Moves one inbox entry to another inbox atomically (forwarding, and
-- requeue of a dead worker's unprocessed events).
-- KEYS: base, 9 source inbox, 10 target inbox, 11 cleanup hash,
--       12 keep-alive hash, 13 keep-alive revision (`went_back`)
-- ARGV: base, 4 entry id, 5 event name, 6 new payload, 7 target worker,
--       8 maxlen, 9 the job key of a start entry a cleaner moves ('' when
--       forwarding), 10 the cleaner's node id when a cleanup moves a dead
--       worker's entry ('' otherwise): its claim must still be its own
--       on 11 the source worker id, 12 worker ttl ms (the recovery window),
--       13 the revisions the cleaner has seen (`went_back`; '' otherwise),
--       14 pending ttl ms (a moved start's fresh guard deadline), 15 the
--       least server time (ms) it can be now by the caller's own clock ('':
--       unknown), for judging the target's silence (see `worker_current`)
-- A start entry moved by a cleaner gets a new fencing token (entry and
-- pending guard alike): the dead or silent worker may have started it just
-- before it went quiet (a start is recorded after the handler's `start`),
-- and the run elsewhere must be fenced off from that one. Its guard gets a
-- fresh deadline too: the new owner has the whole pending time to claim
-- it (a cleanup that came late, after a recovery or an outage, left a
-- deadline due at once, and the stale-pending sweep took the guard before
-- the claim, which was then refused).
-- Returns 'ok' ('ok <token>' for a start a cleaner moved, with its new token:
-- the cleaner remembers the job until its new owner starts it) |
-- 'no_target' (the target does not read its inbox: see
-- `worker_current`) | 'gone' | 'ended' (a cleaner's move of a start of a
-- dispatch marked over, see `dispatch_over`: the entry, its guard and the
-- payload gone) | 'claim_lost' (a cleanup's claim on the source worker
-- is not the cleaner's any more) | 'recovering' (a cleaner's move while the
-- pool recovers, or on a state older than the cleaner has seen: a start it
-- moved before a rollback may be back, its token issued again by the older
-- counter; the entry stays for the cleanup after the window)
if ARGV[10] ~= '' then
  if not claim_held(KEYS[11], ARGV[11], ARGV[10]) then
    -- Not this cleaner's worker any more: the entry stays where it is.
    return 'claim_lost'
  end
  local ttl = tonumber(ARGV[12])
  if went_back(ARGV[13], ttl, KEYS[13]) or recovering(ttl) then
    return 'recovering'
  end
end
local key = ARGV[9]
if ARGV[10] ~= '' and ARGV[5] == 'start' and key and key ~= '' then
  -- A start of a dispatch marked over (a stop or end made to stand again after a
  -- rollback, see `dispatch_over`): ended instead of moved on.
  local stored = redis.call('HGET', PAYLOADS, key)
  if stored and dispatch_over(key, stored) then
    if redis.call('XDEL', KEYS[9], ARGV[4]) == 0 then return 'gone' end
    end_dispatch_over(key)
    return 'ended'
  end
end
if not worker_current(ARGV[7], KEYS[11], KEYS[12], tonumber(ARGV[12]), tonumber(ARGV[15])) then
  return 'no_target'
end
if redis.call('XDEL', KEYS[9], ARGV[4]) == 0 then
  return 'gone'
end
local payload = ARGV[6]
local moved_token
if ARGV[5] == 'start' and key and key ~= '' then
  local old = string.match(payload, '^(%d+) ')
  local guard = mget(PENDING, key)
  if old and guard and string.sub(guard, 1, #old + 1) == old .. ' ' then
    local token = string.format('%d', next_token(key))
    moved_token = token
    payload = token .. string.sub(payload, #old + 1)
    -- "<token> <deadline_ms>[ <node>/<request>]": the rest is kept.
    local due, rest = string.match(string.sub(guard, #old + 2), '^(%d+)(.*)$')
    local deadline = now_ms() + tonumber(ARGV[14])
    if due and tonumber(due) > deadline then deadline = tonumber(due) end
    mset(PENDING, key, string.format('%s %d', token, deadline) .. (rest or ''))
  end
end
stream_add(KEYS[10], ARGV[5], payload, tonumber(ARGV[8]))
if moved_token then return 'ok ' .. moved_token end
return 'ok'
