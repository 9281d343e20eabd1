-- A worker re-asserts a job after it was registered again (Redis lost its
-- data, or the worker was cleaned up while cut off).
-- A job it *runs* takes ownership back when nobody else owns or is starting
-- the job and no newer token was issued, restoring the payload if it
-- vanished.
-- A job it had *suspended* on lease loss (not running) never competes with
-- running copies: while the pool recovers from a data loss, another worker
-- that runs the key (the job was moved during the lease loss) may not have
-- re-asserted yet, and its token is unknown to Redis now. So during the
-- recovery window only the payload is restored: the job becomes an orphan,
-- which the orphan sweep requeues (after its grace period, past the window)
-- unless a running copy re-asserted it meanwhile.
-- KEYS: base
-- ARGV: base, 4 job key, 5 worker id, 6 token, 7 stored payload
--       ("<created_ms> <body>"), 8 'running' | 'suspended', 9 worker ttl ms
-- Returns 'ok' | 'lost' | 'orphaned' (payload restored, ownership not taken)
local key, worker = ARGV[4], ARGV[5]
local j = mget(JOBS, key)
if j then
  if owner_of(j) == worker then return 'ok' end
  return 'lost'
end
if redis.call('HEXISTS', PENDING[1], key) == 1 then return 'lost' end
local current = tonumber(redis.call('HGET', FENCING, key) or '0')
if current > tonumber(ARGV[6]) then return 'lost' end
if ARGV[8] == 'suspended' and recovering(tonumber(ARGV[9])) then
  redis.call('HSETNX', PAYLOADS, key, ARGV[7])
  return 'orphaned'
end
redis.call('HSET', FENCING, key, ARGV[6])
redis.call('HSETNX', PAYLOADS, key, ARGV[7])
mset(JOBS, key, worker .. ' ' .. ARGV[6])
return 'ok'
