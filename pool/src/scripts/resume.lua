-- A worker that stopped its jobs on lease loss renewed again: restart a
-- job that is still its own, with a new fencing token. Not while a cleaner
-- has claimed the worker: the cleaner is handing its jobs to other workers
-- (the worker was silent past its TTL), and a restart here would run a key
-- the cleaner is about to start elsewhere.
-- KEYS: base, 9 cleanup hash
-- ARGV: base, 4 job key, 5 worker id
-- Returns the new token, or false when the job moved or is being moved.
local key, worker = ARGV[4], ARGV[5]
if redis.call('HEXISTS', KEYS[9], worker) == 1 then return false end
if owner_of(mget(JOBS, key)) ~= worker then return false end
local token = next_token(key)
mset(JOBS, key, worker .. ' ' .. token)
return token
