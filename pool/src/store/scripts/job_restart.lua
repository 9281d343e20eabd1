-- Starts the next run of a failed job on the same worker, while Redis still
-- names the failed run (worker and token) the owner: a new fencing token.
-- Not while the pool recovers from a data loss or a rollback, nor on a
-- state older than the caller has seen (`went_back`): the record naming the
-- failed run may be one the lost writes had replaced (the job moved on and
-- was stopped on request elsewhere), and a token issued over it would
-- outrank that stop when it is made to stand again (chaos soak seed 1439:
-- a restart resent on a reconnect after a rollback undid a stop). The
-- worker holds the job until a renewal settles it (`resume.lua`).
-- KEYS: base, 9 failures hash, 10 keep-alive revision (`went_back`)
-- ARGV: base, 4 job key, 5 worker id, 6 token of the failed run, 7 worker
--       ttl ms (the recovery window), 8 the revisions the caller has seen
-- Returns the new token, 0 when Redis names another run (stopped, moved or
-- cleaned up since: nothing changed), or -1 while the pool recovers
-- (nothing changed either). The same call again answers
-- the token it gave: a client resends a call whose reply a dropped
-- connection lost (Redis restarting), and "another run" would make the
-- worker drop a job whose next run Redis names it for.
local key = ARGV[4]
local record = mget(JOBS, key)
if record ~= ARGV[5] .. ' ' .. ARGV[6] then
  -- Done already: Redis names this worker with a newer token, and the
  -- failure record shows this restart made it (only a restart writes a
  -- 'running' failure record with a token).
  local owner, recorded = string.match(record or '', '^(%S+) (%d+)$')
  if owner == ARGV[5] and tonumber(recorded) > tonumber(ARGV[6]) then
    local failure = redis.call('HGET', KEYS[9], key)
    local state, made = string.match(failure or '', '^(%a+) %d+ (%d+) ')
    if state == 'running' and made == recorded then
      return tonumber(recorded)
    end
  end
  return 0
end
local ttl = tonumber(ARGV[7])
if went_back(ARGV[8], ttl, KEYS[10]) or recovering(ttl) then
  return -1
end
local token = next_token(key)
mset(JOBS, key, string.format('%s %d', ARGV[5], token))
local prev = redis.call('HGET', KEYS[9], key)
if prev then
  local state, n, _, at, err = string.match(prev, '^(%a+) (%d+) (%d+) (%d+) (.*)$')
  if state == 'restarting' then
    redis.call('HSET', KEYS[9], key, string.format('running %s %d %s %s', n, token, at, err))
  end
end
return token
