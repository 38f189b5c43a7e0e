/* engine/policy.c: being written (issue 3). */
typedef int mkv_placeholder_policy_t;
