/* quant/quant.c: being written (issue 3). */
typedef int mkv_placeholder_quant_t;
