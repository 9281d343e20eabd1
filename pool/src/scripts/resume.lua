-- A worker that stopped its jobs on lease loss renewed again: restart a
-- job that is still its own, with a new fencing token.
-- KEYS: base
-- ARGV: base, 4 job key, 5 worker id
-- Returns the new token, or false when the job moved.
local key, worker = ARGV[4], ARGV[5]
if owner_of(mget(JOBS, key)) ~= worker then return false end
local token = next_token(key)
mset(JOBS, key, worker .. ' ' .. token)
return token
