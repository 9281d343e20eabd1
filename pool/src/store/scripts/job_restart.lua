-- Starts the next run of a failed job on the same worker, while Redis still
-- names the failed run (worker and token) the owner: a new fencing token.
-- KEYS: base, 9 failures hash
-- ARGV: base, 4 job key, 5 worker id, 6 token of the failed run
-- Returns the new token, or 0 when Redis names another run (stopped,
-- moved or cleaned up since: nothing changed). The same call again answers
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
