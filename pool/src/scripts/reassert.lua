-- A worker re-asserts a job it runs (after Redis lost data, or after it was
-- re-registered): takes ownership back when nobody else owns or is
-- starting the job, restoring the payload if it vanished.
-- KEYS: base
-- ARGV: base, 4 job key, 5 worker id, 6 token, 7 stored payload
--       ("<created_ms> <body>")
-- Returns 'ok' | 'lost'
local key, worker = ARGV[4], ARGV[5]
local j = mget(JOBS, key)
if j then
  if owner_of(j) == worker then return 'ok' end
  return 'lost'
end
if redis.call('HEXISTS', PENDING[1], key) == 1 then return 'lost' end
local current = tonumber(redis.call('HGET', FENCING, key) or '0')
if current > tonumber(ARGV[6]) then return 'lost' end
redis.call('HSET', FENCING, key, ARGV[6])
redis.call('HSETNX', PAYLOADS, key, ARGV[7])
mset(JOBS, key, worker .. ' ' .. ARGV[6])
return 'ok'
