/* log.h - leveled logging to stderr. The level is read once from HOTMOE_LOG (error, warn,
 * info, debug); the CLI may override it with hm_log_set_level. */
#ifndef HM_BASE_LOG_H
#define HM_BASE_LOG_H

typedef enum { HM_LOG_ERROR = 0, HM_LOG_WARN, HM_LOG_INFO, HM_LOG_DEBUG } hm_log_level;

void hm_log_set_level(hm_log_level level);
hm_log_level hm_log_get_level(void);
void hm_log(hm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define HM_LOGE(...) hm_log(HM_LOG_ERROR, __VA_ARGS__)
#define HM_LOGW(...) hm_log(HM_LOG_WARN, __VA_ARGS__)
#define HM_LOGI(...) hm_log(HM_LOG_INFO, __VA_ARGS__)
#define HM_LOGD(...) hm_log(HM_LOG_DEBUG, __VA_ARGS__)

#endif
