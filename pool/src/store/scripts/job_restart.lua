-- Starts the next run of a failed job on the same worker, while Redis still
-- names the failed run (worker and token) the owner: a new fencing token.
-- KEYS: base, 9 failures hash
-- ARGV: base, 4 job key, 5 worker id, 6 token of the failed run
-- Returns the new token, or 0 when Redis names another run (stopped,
-- moved or cleaned up since: nothing changed).
local key = ARGV[4]
if mget(JOBS, key) ~= ARGV[5] .. ' ' .. ARGV[6] then
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
